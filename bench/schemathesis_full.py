"""Schemathesis with every check and phase, 200 examples per operation (the CI test runs 4-8).

Runs tests/apps/expos/test_schemathesis.py in its full mode (RSI_SCHEMATHESIS_FULL) against the
live test server of its fixtures, for the Main Agent (every operation), a Worker and a Reviewer
(the tools), and prints schemathesis' summaries: the figures for docs/benchmarks.md. Zero server
errors and zero schema mismatches is the pass mark (the test fails otherwise).

    nice -n 10 python bench/schemathesis_full.py [--examples 200] [--report /tmp/st-full.txt]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--report", default=str(ROOT / "test-artifacts" / "schemathesis-full.txt"))
    options = parser.parse_args()
    report = Path(options.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("")
    env = {**os.environ, "RSI_SCHEMATHESIS_FULL": str(options.examples), "RSI_SCHEMATHESIS_REPORT": str(report)}
    started = time.monotonic()
    test = "tests/apps/expos/test_schemathesis.py"
    result = subprocess.run([sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider"], cwd=ROOT, env=env)
    print(report.read_text())
    elapsed = time.monotonic() - started
    print(f"examples per operation: {options.examples}; wall time {elapsed:.0f} s; rc {result.returncode}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
