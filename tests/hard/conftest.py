"""The minibench hard profile for CI: its smallest build, and the real stack serving it.

The build goes into ``RSI_MINIBENCH_HARD_CACHE`` when set (checked against the profile's digest,
so a cache from other code is rebuilt), else into the session's temp folder. The stack is the one
the agent end-to-end tests use (tests/workers/agents/stack.py) with the hard build as its minibench.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest
from django.conf import settings

from apps.benchmarks.minibench.hard import build_hard, hard_source_digest
from tests.workers.agents import stack as support

SEED = 0
SIZE = "smoke"


def _is_current(root: Path) -> bool:
    path = root / "manifest.json"
    if not path.is_file():
        return False
    manifest = json.loads(path.read_text())
    return (manifest.get("seed"), manifest.get("size"), manifest.get("source_digest")) == (
        SEED,
        SIZE,
        hard_source_digest(),
    )


@pytest.fixture(scope="session")
def hard_root(tmp_path_factory) -> Path:
    cache = os.environ.get("RSI_MINIBENCH_HARD_CACHE")
    if not cache:
        root = tmp_path_factory.mktemp("minibench-hard") / SIZE
        build_hard(root, seed=SEED, size=SIZE)
        return root
    root = Path(cache)
    if _is_current(root):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_current(root):
            staging = root.parent / f".{root.name}.building-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            build_hard(staging, seed=SEED, size=SIZE)
            shutil.rmtree(root, ignore_errors=True)
            staging.rename(root)
    return root


@pytest.fixture(scope="session")
def hard_stack(django_db_setup, django_db_blocker, tmp_path_factory, hard_root: Path):
    """web + gpu/agents/default workers on the test database, the hard profile installed."""
    base = tmp_path_factory.mktemp("hard-stack")
    roots = support.roots_for(base, hard_root)
    support.apply_roots(roots)
    support.flush_broker()
    with django_db_blocker.unblock():
        support.install(hard_root)
    processes = support.make_stack(roots=roots, log_dir=base / "logs")
    settings.RSI_API_URL = processes.url
    processes.start()
    processes.wait_ready()
    processes.django_db_blocker = django_db_blocker  # type: ignore[attr-defined]
    yield processes
    processes.stop()
    support.flush_broker()
