"""Environment build time per task: RSI-Craft's steps on the minibench variants, inline.

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/rsiweb_bench_h18 \
        .venv/bin/python bench/dojo_build.py <built minibench> [--source minibench-variants:arithmetic] [--repeats 5]

Runs the same service the gpu job runs (`environment_build_execute`) in this process, on a fresh
bench database, and prints one row per task: status, reason, items, seconds, and the steps'
numbers (strong / base scores, flip rate). Set OMP_NUM_THREADS=1 on a shared CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _setup import django_on_bench_db


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("minibench", type=Path)
    parser.add_argument("--source", default="minibench-variants:arithmetic")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--db", default="rsiweb_bench_dojo")
    args = parser.parse_args()
    django_on_bench_db(args.db)
    import torch

    from apps.dojo.services import environment_build_create, environment_build_execute

    torch.set_num_threads(1)
    started = time.monotonic()
    build = environment_build_create(
        source=args.source,
        base_dir=args.minibench / "theta0",
        strong_dir=args.minibench / "references" / "arithmetic",
        config={"repeats": args.repeats},
        enqueue=False,
    )
    environment_build_execute(build=build)
    total = time.monotonic() - started
    print("| task | status | reason | items | seconds | strong | base | flip rate |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for env in build.environments.order_by("name"):
        steps = {d["step"]: d for d in env.decisions}
        flip = steps.get("reliability", {}).get("flip_rate", "")
        strong = "" if env.strong_score is None else f"{env.strong_score:.3f}"
        base = "" if env.base_score is None else f"{env.base_score:.3f}"
        print(f"| {env.name} | {env.status} | {env.reason} | {len(env.sample_ids)} | {env.seconds:.1f} "
              f"| {strong} | {base} | {flip} |")  # fmt: skip
    print(json.dumps({"total_seconds": round(total, 1), **build.summary}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
