"""Run the whole test suite, one pytest session per folder of test files, and add up the results.

Suites start real servers, Celery workers and session-wide fixtures (a finished research run,
trained checkpoints) that commit rows outside any test transaction; a session per folder keeps
one suite's committed state from leaking into another's assertions. The shared minibench is
built once for all of them (RSI_MINIBENCH_CACHE).
"""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# Folders whose tests are not yet part of the suite, with the reason (kept honest: not counted).
EXCLUDED: dict[str, str] = {}


def suites() -> list[Path]:
    """Every folder that holds test files directly: tests/apps/<app>, tests/workers/<package>, ..."""
    folders = {p.parent for p in ROOT.rglob("test_*.py") if p.parent != ROOT}
    return sorted(f for f in folders if f.relative_to(ROOT).as_posix() not in EXCLUDED)


def session_args(suite: Path, every: list[Path]) -> list[str]:
    """The suite's own files: a sub-folder that is a suite of its own runs in its own session."""
    nested = [f for f in every if f != suite and f.is_relative_to(suite)]
    return [str(suite), *(f"--ignore={f}" for f in nested)]


def main() -> int:
    totals = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed_suites = []
    reports = ROOT.parent / "var" / "test-reports"
    reports.mkdir(parents=True, exist_ok=True)
    every = suites()
    for suite in every:
        name = suite.relative_to(ROOT).as_posix()
        xml = reports / f"{name.replace('/', '.')}.xml"
        xml.unlink(missing_ok=True)
        started = time.monotonic()
        print(f"\n=== {suite.relative_to(ROOT.parent)} ===", flush=True)
        code = subprocess.call([sys.executable, "-m", "pytest", *session_args(suite, every), "-q", f"--junitxml={xml}"])
        if xml.exists():
            node = ET.parse(xml).getroot()
            node = node if node.tag == "testsuite" else node.find("testsuite")
            tests, failures = int(node.get("tests", 0)), int(node.get("failures", 0))
            errors, skipped = int(node.get("errors", 0)), int(node.get("skipped", 0))
            totals["passed"] += tests - failures - errors - skipped
            totals["failed"] += failures
            totals["errors"] += errors
            totals["skipped"] += skipped
        if code != 0:
            failed_suites.append(name)
        print(f"--- {name}: exit {code} in {time.monotonic() - started:.0f} s", flush=True)
    for name, reason in EXCLUDED.items():
        print(f"not run: tests/{name} ({reason})")
    if failed_suites:
        print(f"failing suites: {', '.join(failed_suites)}")
    failed = totals["failed"] + totals["errors"]
    print(f"{totals['passed']} passed, {failed} failed, {totals['skipped']} skipped")
    return 1 if failed_suites or failed else 0


if __name__ == "__main__":
    sys.exit(main())
