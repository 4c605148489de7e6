"""Session fixtures for the ML tests: the shared ci minibench and the trained checkpoints they share.

Building and training dominate the runtime, so each happens once per session. The minibench is
the one every suite shares (tests/support/minibench.py: built under a lock into
RSI_MINIBENCH_CACHE when set, and rebuilt there when the builder's code changed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.minibench import broken_runs as shared_broken_runs
from tests.support.minibench import ci_minibench


@pytest.fixture(scope="session")
def minibench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Root of the built ci minibench."""
    return ci_minibench(tmp_path_factory)


@pytest.fixture(scope="session")
def arithmetic_task(minibench: Path) -> dict[str, Any]:
    return json.loads((minibench / "tasks" / "arithmetic" / "task.json").read_text())


@pytest.fixture(scope="session")
def feedback_samples(minibench: Path) -> list[dict[str, Any]]:
    path = minibench / "tasks" / "arithmetic" / "feedback.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="session")
def broken_runs(minibench: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two runs of the reference recipe with one bug each: no EOS, or only 300 training rows
    (tests/support/minibench.py, trained once per machine and shared with the integrity tests)."""
    return shared_broken_runs(minibench, tmp_path_factory)
