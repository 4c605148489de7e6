"""``manage.py demo`` serves the dashboard before the minibench is built, showing the build's
progress; it takes its servers and workers with it, however it ends, and never reuses a stale
server's port.

The demo runs as a child of the test on the embedded default (SQLite, the SQLite broker: no
shared service is touched) with ``--no-run``: the same stack (uvicorn, celery workers for the gpu,
agents and default queues) without building the minibench. The test records every process the
demo started (its descendants, pool children included), ends the demo alone — SIGKILL, which no
process can catch, or SIGTERM — and waits for each of them to be gone and nothing to listen on the port.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from apps.benchmarks.build_progress import build_progress_read, progress_path
from apps.core.procs import Lifeline, port_listened
from tests.support.procs import ROOT, sqlite_env
from tests.workers.agents.stack import free_port

pytestmark = pytest.mark.slow


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: [state, ppid, ...]; None when the pid is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(root: int) -> dict[int, str]:
    """Every living descendant of ``root``, as pid -> start time (to tell a reused pid apart)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            starts[int(entry.name)] = fields[19]
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


def alive(pid: int, start: str) -> bool:
    fields = _stat(pid)
    # A zombie has ended: it only waits for a parent (maybe init) to read its status.
    return fields is not None and fields[19] == start and fields[0] != "Z"


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def wait_for(predicate, *, timeout: float, what: str, log: Path | None = None):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.3)
    detail = f"\n--- demo output ---\n{log.read_text(errors='replace')[-4000:]}" if log else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


class Demo:
    """``manage.py demo --no-run`` in a session of its own, its output in a file."""

    def __init__(self, data_dir: Path, port: int, *extra: str, run: bool = False) -> None:
        self.port = port
        self.log = data_dir / f"demo-{port}.out"
        mode = [] if run else ["--no-run"]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "demo", *mode, "--port", str(port), "--gpu-slots", "1", *extra],
                cwd=ROOT, env={**sqlite_env(data_dir), "OMP_NUM_THREADS": "1"}, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.family: dict[int, str] = {}

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_up(self) -> dict[int, str]:
        """Wait for the stack; returns the processes the demo started (its descendants)."""

        def up() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the demo exited with {self.process.returncode}:\n{self.output()[-4000:]}")
            return "stack up:" in self.output() and answers(f"http://127.0.0.1:{self.port}/healthz")

        wait_for(up, timeout=300, what="the demo's stack", log=self.log)
        self.family = descendants(self.process.pid)
        return self.family

    def survivors(self) -> dict[int, str]:
        return {pid: command_line(pid) for pid, start in self.family.items() if alive(pid, start)}

    def clean_up(self) -> None:
        """Whatever the test found, nothing it started outlives it."""
        for pid, start in self.family.items():
            if alive(pid, start):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One data folder for the module: the SQLite database is migrated once.
    return tmp_path_factory.mktemp("demo-data")


@pytest.fixture
def demo(data_dir: Path) -> Iterator[Demo]:
    started = Demo(data_dir, free_port())
    lifeline = Lifeline([started.process.pid])  # this test's own backstop for the demo process
    yield started
    started.clean_up()
    lifeline.close()


def assert_stack_started(family: dict[int, str]) -> None:
    lines = [command_line(pid) for pid in family]
    assert any("uvicorn" in line for line in lines), lines
    for queue in ("gpu", "agents", "default"):
        assert any("celery" in line and f"-Q {queue}" in line for line in lines), (queue, lines)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_demo_s_servers_and_workers_end_with_it(demo: Demo, how: signal.Signals):
    family = demo.wait_up()
    assert_stack_started(family)

    os.kill(demo.process.pid, how)  # the demo alone, not its children
    code = demo.process.wait(timeout=60)
    assert code == -how if how == signal.SIGKILL else code == 128 + how, demo.output()[-3000:]

    wait_for(lambda: not demo.survivors(), timeout=60, what=f"the demo's processes to end after {how.name}")
    # Nothing listens on the port (a bind could still fail on a connection of another suite that
    # happens to use it as its local port: not a stale server).
    assert not port_listened(demo.port)


def test_a_start_refuses_a_port_held_by_a_stale_server(data_dir: Path):
    port = free_port()
    stale = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    lifeline = Lifeline([stale.pid])
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/"), timeout=30, what="the stale server")
        for command in (["demo", "--no-run"], ["serve"]):
            refused = subprocess.run(
                [sys.executable, "manage.py", *command, "--port", str(port)], cwd=ROOT, env=sqlite_env(data_dir),
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert refused.returncode != 0, refused.stdout
            message = f"port {port} on 127.0.0.1 is already in use by process {stale.pid}"
            assert message in refused.stderr, refused.stderr
        assert stale.poll() is None  # refused, not taken over: the stale server is still there
    finally:
        lifeline.close()
        stale.wait(timeout=30)


def test_the_dashboard_answers_at_once_and_shows_the_minibench_build(tmp_path: Path):
    """A first start: the dashboard answers while the minibench builds, with its progress on the
    sign-in page and in the terminal; ended mid-build, the build goes with the demo and the page
    says the build was interrupted."""
    demo = Demo(tmp_path, free_port(), run=True)  # a data folder of its own: no minibench in it
    lifeline = Lifeline([demo.process.pid])
    base = f"http://127.0.0.1:{demo.port}"
    try:
        wait_for(lambda: "dashboard:" in demo.output() and answers(f"{base}/healthz"), timeout=300,
                 what="the dashboard", log=demo.log)  # fmt: skip

        def building() -> dict | None:
            progress = requests.get(f"{base}/minibench/build.json", timeout=5).json()
            return progress if progress["state"] == "building" else None

        progress = wait_for(building, timeout=120, what="the build's progress", log=demo.log)
        assert progress["profile"] == "demo", progress  # the demo's own profile (a reference trained in minutes)
        assert 0 <= progress["fraction"] < 1, progress
        assert progress["stage"], progress
        assert not (tmp_path / "minibench" / "manifest.json").exists()  # the page answered before the build
        page = requests.get(f"{base}/accounts/login/", timeout=5)
        assert page.status_code == 200
        assert 'id="build-progress"' in page.text
        assert "Building the minibench" in page.text
        assert "/static/dashboard/build_progress.js" in page.text
        wait_for(lambda: re.search(r"\[[#.]{30}\] +\d+%  \w", demo.output()), timeout=60, what="the terminal bar",
                 log=demo.log)  # fmt: skip
        assert "HTTP Request:" not in demo.output()  # no health-check lines in the console

        def builder() -> int | None:
            found = [pid for pid in descendants(demo.process.pid) if "apps.benchmarks.minibench" in command_line(pid)]
            return found[0] if found else None

        child = wait_for(builder, timeout=120, what="the build's child process", log=demo.log)
        wait_for(lambda: building() and building()["stage"] != "starting", timeout=60, what="the build's first stage")
        family = descendants(demo.process.pid)

        os.kill(demo.process.pid, signal.SIGTERM)
        demo.process.wait(timeout=60)
        wait_for(lambda: all(not alive(pid, start) for pid, start in family.items()), timeout=60,
                 what="the demo's processes (the build's included) to end")  # fmt: skip
        assert child in family
        shown = build_progress_read(progress_path(tmp_path / "minibench"))
        assert shown is not None
        assert shown["state"] == "interrupted", shown
    finally:
        demo.family = descendants(demo.process.pid) if demo.process.poll() is None else demo.family
        demo.clean_up()
        lifeline.close()


def test_demo_help_documents_every_option_with_its_default(data_dir: Path):
    shown = subprocess.run([sys.executable, "manage.py", "demo", "--help"], cwd=ROOT, env=sqlite_env(data_dir),
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    # One entry per option: its names, then its help (wrapped), up to the next option.
    entries = [" ".join(e.split()) for e in re.split(r"\n(?=  -)", shown.stdout.split("options:", 1)[1]) if e.strip()]
    named = {entry.split()[0].rstrip(","): entry for entry in entries}
    assert {"--port", "--profile", "--keep-serving", "--no-run", "--gpu-slots", "--wall-seconds"} <= set(named)
    for name, entry in named.items():
        if name not in ("-h", "--version"):
            assert "(default: " in entry, entry
    assert named["--keep-serving"].startswith("--keep-serving, --no-keep-serving keep serving after the run")
    assert named["--keep-serving"].endswith("(default: True)")
