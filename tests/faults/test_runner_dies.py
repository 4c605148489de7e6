"""The stack's processes on the private servers die with the test runner that started them.

The fault-suite version of tests/apps/core/test_demo_processes.py (which ends ``manage.py demo``
on the embedded SQLite): a child interpreter stands in for the test runner and starts web, gpu,
agents and default on this suite's private PostgreSQL and Redis exactly as the ``project``
fixture does (``Project``, each group on a Lifeline), then waits. The test ends that child alone,
by SIGKILL or SIGTERM (neither handled, as pytest handles neither), and waits for every process it
started to be gone, nothing to listen on the web port and the private database to hold no connection of
theirs. While the stack runs, a second start on its port is refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from apps.core.procs import PortInUse, port_listened
from tests.apps.core.test_demo_processes import Demo, assert_stack_started, wait_for
from tests.faults.conftest import DATABASE, project_env, project_stack
from tests.support.procs import ROOT, Lifeline
from tests.support.services import free_port

pytestmark = pytest.mark.slow

# The runner's whole life: the project's processes up, their pids said, then nothing until it ends.
RUNNER = """
import json, sys, time
from pathlib import Path

import django

django.setup()
from tests.faults.conftest import Project, project_stack

spec = json.loads(sys.argv[1])
project = Project(project_stack(env=spec["env"], log_dir=Path(spec["log_dir"]), port=spec["port"]))
project.start("web", "gpu", "agents", "default")
print("stack up:", json.dumps({name: p.pid for name, p in project.stack.processes.items()}), flush=True)
time.sleep(3600)
"""


class Runner(Demo):
    """The stand-in test runner in a session of its own; Demo's waiting, census and clean-up."""

    def __init__(self, env: dict[str, str], data_dir: Path) -> None:
        self.port = free_port()
        self.log = data_dir / "runner.out"
        spec = {"env": env, "log_dir": str(data_dir / "logs"), "port": self.port}
        with self.log.open("wb") as out:
            self.process = subprocess.Popen([sys.executable, "-c", RUNNER, json.dumps(spec)], cwd=ROOT, env=env,
                                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.family: dict[int, str] = {}

    def pids(self) -> dict[str, int]:
        return json.loads(self.output().split("stack up:", 1)[1].splitlines()[0])


@pytest.fixture
def runner(database_url: str, redis_server, artifact_roots: dict[str, str], tmp_path: Path) -> Iterator[Runner]:
    env = project_env(database_url=database_url, redis_url=redis_server.url, roots=artifact_roots,
                      data_dir=tmp_path / "data")  # fmt: skip
    started = Runner(env, tmp_path)
    lifeline = Lifeline([started.process.pid])  # this test's own backstop for the runner
    yield started
    started.clean_up()
    lifeline.close()


def their_connections(database_url: str) -> list[tuple[int, str]]:
    """(backend pid, application) of every connection to the private database but this query's own."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        rows = connection.execute("SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s AND "
                                  "pid <> pg_backend_pid()", [DATABASE]).fetchall()  # fmt: skip
    return [(pid, name) for pid, name in rows]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_project_s_processes_and_their_connections_end_with_the_runner(
    runner: Runner, database_url: str, artifact_roots: dict[str, str], tmp_path: Path, how: signal.Signals
):
    family = runner.wait_up()
    assert_stack_started(family)
    assert set(runner.pids().values()) <= set(family)
    wait_for(lambda: their_connections(database_url), timeout=60, what="the stack's database connections")

    # A second start on the running stack's port refuses, naming the holder, and starts nothing.
    second = project_stack(env=project_env(database_url=database_url, redis_url="redis://127.0.0.1:1/0",
                                           roots=artifact_roots, data_dir=tmp_path / "data"),
                           log_dir=tmp_path / "second", port=runner.port)  # fmt: skip
    try:
        with pytest.raises(PortInUse, match=f"port {runner.port} on 127.0.0.1 is already in use by process") as refused:
            second.start(("web", "gpu"))
    finally:
        second.stop()  # a no-op unless it started something after all
    holder = int(str(refused.value).split("by process ", 1)[1].split()[0])
    assert holder in family
    assert second.processes == {}

    os.kill(runner.process.pid, how)  # the runner alone, not its children
    assert runner.process.wait(timeout=60) == -how, runner.output()[-3000:]

    wait_for(lambda: not runner.survivors(), timeout=60, what=f"the runner's processes to end after {how.name}")
    # Nothing listens on the port (a bind could still fail on a connection of another suite that
    # happens to use it as its local port: not a stale server).
    assert not port_listened(runner.port)
    # Their backends end when the sockets of the dead processes close (bounded: no lingering sessions).
    wait_for(lambda: not their_connections(database_url), timeout=30, what="the stack's connections to close")
