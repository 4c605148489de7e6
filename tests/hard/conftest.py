"""The minibench hard profile for CI: its smallest build, and the real stack serving it.

The build goes into ``RSI_MINIBENCH_HARD_CACHE`` when set (checked against the profile's digest,
so a cache from other code is rebuilt), else into the session's temp folder. The stack is the one
the agent end-to-end tests use (tests/workers/agents/stack.py) with the hard build as its minibench.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.conf import settings

from apps.benchmarks.minibench.hard import build_hard, hard_source_digest
from tests.support.minibench import cached_build, manifest_matches
from tests.workers.agents import stack as support

SEED = 0
SIZE = "smoke"


def _is_current(root: Path) -> bool:
    return manifest_matches(root, {"seed": SEED, "size": SIZE, "source_digest": hard_source_digest()})


@pytest.fixture(scope="session")
def hard_root(tmp_path_factory) -> Path:
    return cached_build(
        os.environ.get("RSI_MINIBENCH_HARD_CACHE"),
        is_current=_is_current,
        build=lambda root: build_hard(root, seed=SEED, size=SIZE),
        tmp_path_factory=tmp_path_factory,
        name=f"hard-{SIZE}",
    )


@pytest.fixture(scope="session")
def hard_stack(django_db_setup, django_db_blocker, tmp_path_factory, hard_root: Path):
    """web + gpu/agents/default workers on the test database, the hard profile installed."""
    base = tmp_path_factory.mktemp("hard-stack")
    roots = support.prepare(base, hard_root, django_db_blocker)
    processes = support.make_stack(roots=roots, log_dir=base / "logs")
    settings.RSI_API_URL = processes.url
    processes.start()
    processes.wait_ready()
    processes.django_db_blocker = django_db_blocker  # type: ignore[attr-defined]
    yield processes
    processes.stop()
    support.flush_broker()
