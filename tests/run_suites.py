"""Run the whole test suite, one pytest session per folder of test files, and add up the results.

Suites start real servers, Celery workers and session-wide fixtures (a finished research run,
trained checkpoints) that commit rows outside any test transaction; a session per folder keeps
one suite's committed state from leaking into another's assertions. The shared minibench is
built once for all of them (RSI_MINIBENCH_CACHE).

Sessions run in lanes (``RSI_TEST_LANES``, 2 by default: the machine's two cores). Most of a suite's
time is spent waiting on servers, workers, browsers and single-threaded training, so two at once
finish in little more than the longer one's time. Each lane has its own database, Redis database
and data folder, so two sessions never see each other's rows, queues or files. The longest suites
start first (``EXPECTED_SECONDS``); each suite's output is printed whole when it ends.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from dj_database_url import parse as parse_database_url

ROOT = Path(__file__).resolve().parent
# Folders whose tests are not yet part of the suite, with the reason (kept honest: not counted).
EXCLUDED: dict[str, str] = {}
# Seconds each suite took in CI (2 cores, warm caches), to start the long ones first. A suite not
# listed counts as a short one; a wrong figure only changes the order.
EXPECTED_SECONDS = {
    "workers/agents": 2600,  # + test_agent_suite.py (~200 s)
    "apps/ml": 900,
    "hard": 600,  # the hard profile's smoke build (cached) and one three-run ablation suite
    "faults": 410,  # + the pool child, full disk and runner-dies cases (~80 s)
    "apps/expos": 320,
    "apps/jobs": 315,
    "e2e": 275,
    "apps/benchmarks/inspect": 240,
    "apps/integrity/redteam": 200,
    "apps/integrity": 150,
    "apps/dashboard": 110,
    "apps/dojo": 150,  # + test_trajectory_export.py (about 50 s, a gpu worker)
    "vllm": 170,  # + the Inspect adapter on vLLM (three formats)
}
# Lane 0 keeps the test settings' database and Redis database; lane n adds n to both.
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/rsiweb"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/9"


def suites() -> list[Path]:
    """Every folder that holds test files directly: tests/apps/<app>, tests/workers/<package>, ..."""
    folders = {p.parent for p in ROOT.rglob("test_*.py") if p.parent != ROOT}
    return sorted(f for f in folders if f.relative_to(ROOT).as_posix() not in EXCLUDED)


def session_args(suite: Path, every: list[Path]) -> list[str]:
    """The suite's own files: a sub-folder that is a suite of its own runs in its own session."""
    nested = [f for f in every if f != suite and f.is_relative_to(suite)]
    return [str(suite), *(f"--ignore={f}" for f in nested)]


def lane_env(lane: int) -> dict[str, str]:
    """The environment of lane ``lane``: its own database name, Redis database and data folder."""
    env = dict(os.environ)
    if lane == 0:
        return env
    database = env.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    name = parse_database_url(database)["NAME"]
    env["DATABASE_URL"] = database.rsplit("/", 1)[0] + f"/{name}_lane{lane}"
    redis = env.get("REDIS_URL") or DEFAULT_REDIS_URL
    base, _, number = redis.rpartition("/")
    env["REDIS_URL"] = f"{base}/{(int(number) if number.isdigit() else 0) + lane}"
    env["RSI_DATA_DIR"] = str(ROOT.parent / "var" / f"lane{lane}")
    return env


def count(xml: Path) -> dict[str, int]:
    if not xml.exists():
        return {}
    node = ET.parse(xml).getroot()
    node = node if node.tag == "testsuite" else node.find("testsuite")
    assert node is not None
    tests, failures = int(node.get("tests", 0)), int(node.get("failures", 0))
    errors, skipped = int(node.get("errors", 0)), int(node.get("skipped", 0))
    return {"passed": tests - failures - errors - skipped, "failed": failures, "errors": errors, "skipped": skipped}


def main() -> int:
    totals = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed_suites: list[str] = []
    reports = ROOT.parent / "var" / "test-reports"
    reports.mkdir(parents=True, exist_ok=True)
    every = suites()
    ordered = sorted(every, key=lambda s: -EXPECTED_SECONDS.get(s.relative_to(ROOT).as_posix(), 0))
    todo: queue.Queue[Path] = queue.Queue()
    for suite in ordered:
        todo.put(suite)
    lanes = max(1, int(os.environ.get("RSI_TEST_LANES", "2")))
    printing = threading.Lock()
    began = time.monotonic()

    def lane(number: int) -> None:
        env = lane_env(number)
        while True:
            try:
                suite = todo.get_nowait()
            except queue.Empty:
                return
            name = suite.relative_to(ROOT).as_posix()
            xml = reports / f"{name.replace('/', '.')}.xml"
            log = reports / f"{name.replace('/', '.')}.log"
            xml.unlink(missing_ok=True)
            started = time.monotonic()
            with open(log, "w") as out:
                args = [sys.executable, "-m", "pytest", *session_args(suite, every), "-q", f"--junitxml={xml}"]
                code = subprocess.call(args, stdout=out, stderr=subprocess.STDOUT, env=env)
            seconds = time.monotonic() - started
            with printing:
                print(f"\n=== {suite.relative_to(ROOT.parent)} (lane {number}) ===", flush=True)
                print(log.read_text(errors="replace"), end="", flush=True)
                for key, value in count(xml).items():
                    totals[key] += value
                if code != 0:
                    failed_suites.append(name)
                print(f"--- {name}: exit {code} in {seconds:.0f} s (at {time.monotonic() - began:.0f} s)", flush=True)

    threads = [threading.Thread(target=lane, args=(n,), name=f"lane-{n}") for n in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, reason in EXCLUDED.items():
        print(f"not run: tests/{name} ({reason})")
    if failed_suites:
        print(f"failing suites: {', '.join(sorted(failed_suites))}")
    failed = totals["failed"] + totals["errors"]
    took = time.monotonic() - began
    print(f"{totals['passed']} passed, {failed} failed, {totals['skipped']} skipped in {took:.0f} s")
    return 1 if failed_suites or failed else 0


if __name__ == "__main__":
    sys.exit(main())
