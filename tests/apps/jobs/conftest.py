"""Fixtures for the job engine: the minibench (built once per session), and real Celery workers.

Workers are `celery -A rsiweb worker` subprocesses on the real Redis (this suite's db) and the
test database, so tests that use them are transactional: the workers must see committed rows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from apps.core.hashing import sha256_tree
from apps.datapool.models import DataEntry
from apps.datapool.services import data_register_from_workspace
from apps.datapool.storage import artifact_store, checkpoint_key
from apps.experiments.services import checkpoint_register, manifest_digest
from tests.support.procs import ROOT, Lifeline, child_env

# Liveness timing for the workers under test: beat twice a second, count as dead after 6 s
# (twelve missed beats: a loaded 2-core machine must not look like a dead worker).
HEARTBEAT_SECONDS = "0.5"
STALE_SECONDS = "6"
REAPER_INTERVAL_SECONDS = "1"


@pytest.fixture(scope="session")
def minibench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared `ci` minibench (tests/support/minibench.py)."""
    from tests.support.minibench import ci_minibench  # noqa: PLC0415 - heavy (torch), fixture only

    return ci_minibench(tmp_path_factory)


@pytest.fixture(scope="session", autouse=True)
def _empty_broker_db() -> None:
    # Messages left by an earlier session name job ids a new test database may reuse.
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


@pytest.fixture
def artifact_root(settings, tmp_path: Path) -> Path:
    """A fresh artifact store and sealed folder per test, seen by this process and its workers."""
    settings.ARTIFACT_ROOT = str(tmp_path / "artifacts")
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    Path(settings.ARTIFACT_ROOT).mkdir()
    Path(settings.SEALED_ROOT).mkdir()
    return Path(settings.ARTIFACT_ROOT)


@pytest.fixture
def theta0(minibench_dir: Path, artifact_root: Path):
    """θ0 of the minibench, put into the artifact store and registered as a base checkpoint."""
    manifest = sha256_tree(minibench_dir / "theta0")
    uri = artifact_store().put_dir(minibench_dir / "theta0", key=checkpoint_key(manifest_digest(manifest)))
    return checkpoint_register(handle=f"mb/theta0/{os.urandom(4).hex()}", uri=uri, manifest=manifest, is_base=True)


@pytest.fixture
def data_entry(minibench_dir: Path, artifact_root: Path, tmp_path: Path) -> Callable[..., DataEntry]:
    """A datapool entry (registered through the datapool service) of a catalog dataset's first rows."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()

    def make(dataset: str = "arithmetic-clean", rows: int = 300) -> DataEntry:
        lines = (minibench_dir / "catalog" / dataset / "data.jsonl").read_text(encoding="utf-8").splitlines()[:rows]
        (workspace / f"{dataset}-{rows}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return data_register_from_workspace(workspace=workspace, path=f"{dataset}-{rows}.jsonl", name=dataset)

    return make


class CeleryWorker:
    """One `celery worker` subprocess in its own process group (so SIGKILL takes the whole worker),
    which dies with the test process however it ends (its Lifeline)."""

    def __init__(self, name: str, queues: str, env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "rsiweb", "worker", "-Q", queues, "-n", f"{name}@%h",
             "--pool=prefork", "--concurrency=1", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel=INFO"],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self._lifeline = Lifeline([self.proc.pid])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.log():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"worker {self.name} did not start:\n{self.log()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the worker's main process and its pool child: no shutdown, no ack, no goodbye."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._lifeline.forget(self.proc.pid)  # reaped: the group number may be reused

    def stop(self) -> None:
        if self.proc.poll() is None:
            # To the main process only: it stops its pool child itself (a child killed under it
            # would first be replaced by a fresh one, which costs seconds).
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._lifeline.close()  # its pool child too, should one have outlived the main process
        self._log.close()


def job_runner_env(**extra: str) -> dict[str, str]:
    """The environment of a process that runs jobs for these tests (a worker, a Slurm batch job):
    the test database, this suite's Redis, artifact store and sealed folder, and the fast liveness
    timing above."""
    return child_env(
        REDIS_URL=settings.CELERY_BROKER_URL,
        RSI_ARTIFACT_ROOT=settings.ARTIFACT_ROOT,
        RSI_SEALED_ROOT=settings.SEALED_ROOT,
        RSI_JOB_HEARTBEAT_SECONDS=HEARTBEAT_SECONDS,
        RSI_JOB_STALE_SECONDS=STALE_SECONDS,
        RSI_REAPER_INTERVAL_SECONDS=REAPER_INTERVAL_SECONDS,
        OMP_NUM_THREADS="1",
        **extra,
    )


@pytest.fixture
def celery_worker(transactional_db, artifact_root: Path, tmp_path: Path) -> Iterator[Callable[..., CeleryWorker]]:
    """Start real workers on the gpu and default queues; all are stopped when the test ends.

    Keyword arguments of ``start`` other than its own are extra environment for that worker.
    """
    started: list[CeleryWorker] = []
    env = job_runner_env()

    def start(name: str = "w1", queues: str = "gpu,default", wait: bool = True, **env_overrides: str) -> CeleryWorker:
        worker = CeleryWorker(name, queues, {**env, **env_overrides}, tmp_path / f"{name}.log")
        started.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()
    # Killed workers leave unacknowledged messages behind; the next test starts clean.
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


def wait_for(predicate: Callable[[], object], *, timeout: float, what: str, logs: Callable[[], str] | None = None):
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` (and worker logs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    detail = f"\n--- worker log ---\n{logs()[-4000:]}" if logs else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
