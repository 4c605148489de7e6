"""A process pool's children die with the process that started them (apps.core.procs.die_with_parent).

A parent starts a spawn pool whose busy child would run for a minute, and is killed; the child
must be gone within seconds. Without the initializer it runs on (the second case shows the test
can tell).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.procs import ROOT

PARENT = """
import multiprocessing, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from apps.core.procs import die_with_parent

def busy(path):
    with open(path, "w") as out:
        out.write(str(os.getpid()))
    time.sleep(60)

if __name__ == "__main__":
    pid_file = sys.argv[1]
    options = {"initializer": die_with_parent, "initargs": (os.getpid(),)} if sys.argv[2] == "tied" else {}
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), **options) as pool:
        pool.submit(busy, pid_file).result()
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _wait(predicate, seconds: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("mode", "how"),
    [("tied", signal.SIGKILL), ("tied", signal.SIGTERM), ("untied", signal.SIGKILL)],
    ids=["sigkill", "sigterm", "without-the-initializer"],
)
def test_a_pool_child_dies_with_the_process_that_started_it(tmp_path: Path, mode: str, how: signal.Signals):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, str(script), str(pid_file), mode], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    child = 0
    try:
        assert _wait(lambda: pid_file.is_file() and pid_file.read_text().strip(), 60), "the pool never ran its task"
        child = int(pid_file.read_text())
        assert _alive(child)
        parent.send_signal(how)
        parent.wait(10)
        gone = _wait(lambda: not _alive(child), 5)
        assert gone is (mode == "tied"), f"{mode} child alive after its parent's {how.name}: {not gone}"
    finally:
        parent.kill()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
