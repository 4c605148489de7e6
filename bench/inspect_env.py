"""Time the Inspect environment: a cold build by ``./dev inspect-env``, a warm reuse, a runner start.

    .venv/bin/python bench/inspect_env.py [--keep] [--json]

The cold build goes into a fresh temporary RSI_ENVS_ROOT (pip's own download cache is whatever
this host has: say so with the figure); the warm call finds ``.rsiweb-ready`` and returns at once.
Then the runner's ``describe`` of inspect_evals/gsm8k is timed: the fixed cost every Inspect
evaluation and registration pays to import inspect-ai in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return time.monotonic() - started, done.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep", action="store_true", help="keep the temporary env root")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    envs = Path(tempfile.mkdtemp(prefix="rsiweb-bench-envs-"))
    env = {**os.environ, "RSI_ENVS_ROOT": str(envs)}
    try:
        cold, path = timed([str(ROOT / "dev"), "inspect-env"], env)
        warm, _ = timed([str(ROOT / "dev"), "inspect-env"], env)
        with tempfile.TemporaryDirectory() as tmp:
            spec, out = Path(tmp) / "spec.json", Path(tmp) / "out.json"
            spec.write_text(json.dumps({"task": "inspect_evals/gsm8k", "task_args": {"fewshot": 0}}))
            runner = ROOT / "apps/benchmarks/harness/inspect_runner.py"
            describe, _ = timed([f"{path}/bin/python", str(runner), "describe", str(spec), str(out)], env)
        size = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
        result = {
            "cold_build_s": round(cold, 1), "warm_reuse_s": round(warm, 2), "runner_describe_s": round(describe, 1),
            "env_mb": round(size / 2**20), "load_average": os.getloadavg(), "cpus": os.cpu_count(),
        }  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(envs, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
