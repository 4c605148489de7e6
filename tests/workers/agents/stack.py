"""The real stack for end-to-end agent runs: the built minibench, the web server, and Celery workers.

The same processes ``manage.py demo`` starts (``apps.flows.management.commands.demo.Stack``), here on
the test PostgreSQL database and this suite's Redis db, with short loop timings so a run ends soon.
A session holds one stack; the restart test kills and restarts it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from django.conf import settings

from apps.benchmarks.services import minibench_install
from apps.flows.management.commands.demo import Stack
from apps.research.models import Run
from tests.apps.benchmarks.minibench_fixture import minibench_root as built
from tests.support.procs import child_env

# Liveness and loop timing for the processes under test (seconds).
TIMING = {
    "RSI_JOB_HEARTBEAT_SECONDS": "1",
    "RSI_JOB_STALE_SECONDS": "20",
    "RSI_REAPER_INTERVAL_SECONDS": "2",
    "RSI_AGENT_POLL_SECONDS": "1",
    "RSI_AGENT_WAIT_SECONDS": "20",
    "RSI_RUN_SUPERVISE_SECONDS": "1",
    "RSI_AGENT_LOST_AFTER_SECONDS": "20",
    "RSI_AGENT_STEP_LEASE_SECONDS": "120",
    "RSI_FINAL_GRACE_SECONDS": "60",
    "RSI_RUN_QUIET_SECONDS": "60",
    "OMP_NUM_THREADS": "1",
    "RSI_TOKEN_RATE": "",
}


def minibench_root(tmp_path_factory: Any) -> Path:
    """The built `ci` minibench: ``RSI_MINIBENCH_CACHE`` when it holds one (built there otherwise)."""
    return built(tmp_path_factory)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def roots_for(base: Path, minibench: Path) -> dict[str, str]:
    """Folders shared by this process and the stack's processes (the sealed root stays separate)."""
    roots = {
        "ARTIFACT_ROOT": str(base / "artifacts"),
        "ARTIFACT_CACHE_DIR": str(base / "artifact-cache"),
        "SEALED_ROOT": str(base / "sealed"),
        "WORKSPACE_ROOT": str(base / "workspaces"),
        "MINIBENCH_ROOT": str(minibench),
    }
    for key, value in roots.items():
        if key != "MINIBENCH_ROOT":
            Path(value).mkdir(parents=True, exist_ok=True)
    return roots


def apply_roots(roots: dict[str, str]) -> None:
    for key, value in roots.items():
        setattr(settings, key, value)


def install(minibench: Path) -> dict[str, Any]:
    """Register θ0, the reference and the sealed benchmark (idempotent; re-done after a flush)."""
    return minibench_install(root=minibench)


def prepare(base: Path, minibench: Path, django_db_blocker: Any) -> dict[str, str]:
    """Roots under `base` applied to this process, an empty broker, the minibench installed."""
    roots = roots_for(base, minibench)
    apply_roots(roots)
    flush_broker()
    with django_db_blocker.unblock():
        install(minibench)
    return roots


def make_stack(*, roots: dict[str, str], log_dir: Path, extra_env: dict[str, str] | None = None) -> Stack:
    env = child_env(
        REDIS_URL=settings.CELERY_BROKER_URL,
        RSI_ARTIFACT_ROOT=roots["ARTIFACT_ROOT"],
        RSI_SEALED_ROOT=roots["SEALED_ROOT"],
        RSI_WORKSPACE_ROOT=roots["WORKSPACE_ROOT"],
        RSI_MINIBENCH_ROOT=roots["MINIBENCH_ROOT"],
        **TIMING,
        **(extra_env or {}),
    )
    env.pop("RSI_DATA_DIR", None)
    env["RSI_DATA_DIR"] = str(Path(roots["ARTIFACT_ROOT"]).parent / "data")
    return Stack(env=env, log_dir=log_dir, port=free_port(), gpu_slots=2, agent_threads=4)


def flush_broker() -> None:
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str, stack: Stack | None = None,
             every: float = 1.0) -> Any:  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    logs = ""
    if stack is not None:
        logs = "\n".join(f"--- {name} ---\n{stack.log(name)[-3000:]}" for name in ("agents", "gpu", "default", "web"))
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}")


def run_status(run: Any) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run.pk)
