"""The fault suite's world: one private PostgreSQL cluster and one redis-server for the session.

Tests here kill, stop and restart the database and the broker, so they never use the shared
instances (STYLE.md 31b). Both servers start on free ports under the session's temporary folder,
the project's migrations run on a database of the private cluster (in a child ``manage.py
migrate``), and this process's ORM and Celery app point at them. Before each test both servers
are restarted (started again if a test left one down) and Redis is emptied, so each case begins
from a running, clean broker. ``project`` starts the stack's processes (web, Celery workers by
queue) on the private servers; they die with the test process (``Lifeline``).

Tests use ``transactional_db``: the processes under test must see committed rows. After a test
that started processes, every event chain on the private database must verify. ``training``
queues real trainings of the minibench θ0 (stored in the test's artifact root, which a module
may override: test_full_disk mounts a small tmpfs there); ``project_env`` and ``project_stack``
are how ``project`` builds its processes, for a test whose child process starts them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from apps.core.hashing import sha256_tree
from apps.datapool.models import DataEntry
from apps.datapool.services import data_register_from_workspace
from apps.datapool.storage import artifact_store, checkpoint_key
from apps.experiments.events import chain_verify
from apps.experiments.models import Checkpoint, EventChain
from apps.experiments.services import checkpoint_register, manifest_digest
from apps.flows.management.commands.demo import Stack
from apps.flows.pipeline import train_job_spec
from apps.jobs.choices import JobKind
from apps.jobs.models import Job
from apps.jobs.services import job_enqueue
from apps.research.models import Run
from rsiweb.celery import app as celery_app
from tests.factories import make_run
from tests.support.procs import ROOT, Lifeline, child_env
from tests.support.services import PostgresCluster, RedisServer, free_port

DATABASE = "rsiweb_faults"
LOGGING_STEPS = 5  # the training fixture's logging_steps

# Liveness and loop timing for the processes under test (seconds): quick reapers and short
# leases, so a lost message or a dead worker is noticed within a test's patience.
TIMING = {
    "RSI_JOB_HEARTBEAT_SECONDS": "0.5",
    "RSI_JOB_STALE_SECONDS": "6",
    "RSI_REAPER_INTERVAL_SECONDS": "1",
    "RSI_AGENT_POLL_SECONDS": "1",
    "RSI_RUN_SUPERVISE_SECONDS": "1",
    "OMP_NUM_THREADS": "1",
    "RSI_TOKEN_RATE": "",
}


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster()  # not under pytest's folder: the postgres account cannot enter it
    cluster.start()
    yield cluster
    cluster.stop()
    cluster.remove()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def database_url(pg_cluster: PostgresCluster) -> str:
    """The private database, migrated by ``manage.py migrate`` in a child process."""
    url = pg_cluster.create_database(DATABASE)
    result = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
        cwd=ROOT, env=child_env(DATABASE_URL=url), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(f"migrate on the private cluster failed:\n{result.stderr[-4000:]}")
    return url


@pytest.fixture(scope="session")
def django_db_setup(database_url: str, pg_cluster: PostgresCluster, redis_server: RedisServer) -> None:
    """This process's ORM and Celery app on the private servers (instead of a test database).

    The settings dict is the one the connection handler holds, so changing it in place (with no
    connection open) moves every later connection.
    """
    connections.close_all()
    settings.DATABASES["default"].update(NAME=DATABASE, HOST="127.0.0.1", PORT=pg_cluster.port, USER="postgres",
                                         PASSWORD="")  # fmt: skip
    settings.CELERY_BROKER_URL = redis_server.url
    celery_app.conf.broker_url = redis_server.url
    # Forget producer connections made to the shared Redis: the next send connects anew.
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


@pytest.fixture(autouse=True)
def _services_fresh(pg_cluster: PostgresCluster, redis_server: RedisServer) -> None:
    """Each case starts on a just-restarted database and an empty, unpersisted broker."""
    connections.close_all()
    pg_cluster.restart()
    redis_server.appendonly = False
    redis_server.stop()
    redis_server.wipe()
    redis_server.start()


@pytest.fixture
def artifact_roots(settings, tmp_path: Path) -> dict[str, str]:
    """Fresh artifact, sealed and workspace folders, seen by this process and the project's."""
    roots = {
        "ARTIFACT_ROOT": str(tmp_path / "artifacts"),
        "SEALED_ROOT": str(tmp_path / "sealed"),
        "WORKSPACE_ROOT": str(tmp_path / "workspaces"),
    }
    for key, value in roots.items():
        Path(value).mkdir()
        setattr(settings, key, value)
    return roots


@pytest.fixture(scope="session")
def minibench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.minibench import ci_minibench  # noqa: PLC0415 - heavy (torch), fixture only

    return ci_minibench(tmp_path_factory)


@dataclass
class Training:
    """``training(max_steps)`` queues a training job of θ0 on 300 clean catalog rows for ``run``."""

    run: Run
    theta0: Checkpoint
    data: DataEntry

    def __call__(self, max_steps: int) -> Job:
        hyper = {"max_steps": max_steps, "batch_size": 8, "logging_steps": LOGGING_STEPS}
        spec = train_job_spec(input_checkpoint=self.theta0, data=[self.data], hyperparameters=hyper)
        return job_enqueue(kind=JobKind.TRAIN, spec=spec, run=self.run, time_limit_seconds=900)


@pytest.fixture
def training(transactional_db, artifact_roots, minibench_dir: Path, tmp_path: Path) -> Training:
    """θ0 and the rows stored in the artifact root and registered, and a (created) run on them."""
    manifest = sha256_tree(minibench_dir / "theta0")
    uri = artifact_store().put_dir(minibench_dir / "theta0", key=checkpoint_key(manifest_digest(manifest)))
    theta0 = checkpoint_register(handle="mb/theta0/faults", uri=uri, manifest=manifest, is_base=True)
    lines = (minibench_dir / "catalog" / "arithmetic-clean" / "data.jsonl").read_text().splitlines()[:300]
    (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n")
    entry = data_register_from_workspace(workspace=tmp_path, path="rows.jsonl", name="arithmetic-clean")
    return Training(run=make_run(base_checkpoint=theta0), theta0=theta0, data=entry)


class Project:
    """The stack's processes on the private servers, tied to the test process by a Lifeline."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self._lifelines: list[Lifeline] = []

    def start(self, *names: str, timeout: float = 180) -> Project:
        """Start ``names`` (of web, gpu, agents, default) and wait until each is ready."""
        self.stack.start(names)
        self._lifelines.append(Lifeline([self.stack.processes[name].pid for name in names]))
        self.stack.wait_ready(timeout=timeout)
        return self

    def process(self, name: str) -> subprocess.Popen[bytes]:
        return self.stack.processes[name]

    def alive(self, name: str) -> bool:
        return self.process(name).poll() is None

    def log(self, name: str) -> str:
        return self.stack.log(name)

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.log(name)[-3000:]}" for name in self.stack.processes)

    def stop(self) -> None:
        self.stack.stop()
        for lifeline in self._lifelines:
            lifeline.close()
        self._lifelines.clear()


def project_env(*, database_url: str, redis_url: str, roots: dict[str, str], data_dir: Path,
                **extra_env: str) -> dict[str, str]:  # fmt: skip
    """The environment of the project's processes on the private servers, with the suite's timing."""
    return child_env(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        RSI_ARTIFACT_ROOT=roots["ARTIFACT_ROOT"],
        RSI_SEALED_ROOT=roots["SEALED_ROOT"],
        RSI_WORKSPACE_ROOT=roots["WORKSPACE_ROOT"],
        RSI_DATA_DIR=str(data_dir),
        **{**TIMING, **extra_env},  # a test's own values win over the suite's timing
    )


def project_stack(*, env: dict[str, str], log_dir: Path, commands: dict[str, list[str]] | None = None,
                  **options: Any) -> Stack:  # fmt: skip
    """The Stack of the project's processes; ``options`` override Stack's (agent_pool, port, ...)."""
    return Stack(env=env, log_dir=log_dir, overrides=commands or {},
                 **{"port": free_port(), "gpu_slots": 1, "agent_threads": 2, **options})  # fmt: skip


@pytest.fixture
def project(
    transactional_db, database_url: str, redis_server: RedisServer, artifact_roots: dict[str, str], tmp_path: Path
) -> Iterator[Callable[..., Project]]:
    """``project("agents", "default", RSI_X="1")``: start those processes on the private servers.

    ``commands`` replaces a process's command line (``{"agents": [...]}``), ``stack_options``
    overrides the Stack's (``{"agent_pool": "prefork"}``); other keyword arguments are extra
    environment. Every process started is stopped when the test ends.
    """
    started: list[Project] = []

    def start(*names: str, commands: dict[str, list[str]] | None = None, stack_options: dict[str, Any] | None = None,
              **extra_env: str) -> Project:  # fmt: skip
        env = project_env(database_url=database_url, redis_url=redis_server.url, roots=artifact_roots,
                          data_dir=tmp_path / "data", **extra_env)  # fmt: skip
        stack = project_stack(env=env, log_dir=tmp_path / f"logs-{len(started)}", commands=commands,
                              **(stack_options or {}))  # fmt: skip
        project = Project(stack)
        started.append(project)
        return project.start(*names)

    yield start
    for project in started:
        project.stop()
    # Whatever the case broke and mended, every event chain it wrote still verifies: no event
    # lost, altered or duplicated (checked before the test database is emptied).
    for key in EventChain.objects.order_by("key").values_list("key", flat=True):
        report = chain_verify(key)
        assert report.ok, f"event chain {key} broken at seq {report.broken_at}: {report.reason}"
