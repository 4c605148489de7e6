"""The suite table for the two offline agents (issue 18): heuristic vs heuristic-weak on the minibench.

    cd bench && RSI_MINIBENCH_CACHE=/path/to/built/minibench ../.venv/bin/python agent_suite.py \
        [--tasks minibench/arithmetic ...] [--train-steps 200] [--screen-steps 60] [--max-workers 3] \
        [--batch-size 64] [--timeout 14400]

Creates and launches one agent suite through the services (apps/dojo/suites.py) on the real stack
(uvicorn + Celery gpu/agents/default workers, a fresh bench database, Redis db 12 unless REDIS_URL
says otherwise), waits for the suite's advance clock to finish it, and prints the per-agent table
and the per-cell rows from apps/dojo/suite_stats.py, plus the wall time. Every task of the built
minibench is evaluated unless ``--tasks`` names some (the ci build has one task, arithmetic).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from _setup import django_on_bench_db, minibench_stack_folders
from orchestration import _start_stack


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="*", help="benchmark names (default: every installed minibench task)")
    parser.add_argument("--agents", nargs="*", default=["heuristic", "heuristic-weak"])
    parser.add_argument("--max-workers", type=int, default=3)
    parser.add_argument("--screen-steps", type=int, default=60)
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--wall-seconds", type=int, default=3600)
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=4 * 3600)
    args = parser.parse_args()
    cache, base = minibench_stack_folders("/tmp/rsiweb-bench-agent-suite")
    django_on_bench_db("rsiweb_bench_agent_suite")
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    from apps.benchmarks.services import minibench_install
    from apps.dojo.models import AgentSuite
    from apps.dojo.suite_stats import suite_stats
    from apps.dojo.suites import suite_create, suite_launch

    installed = minibench_install(root=Path(cache))
    tasks = args.tasks or sorted(str(t["benchmark"]).partition("@")[0] for t in installed["tasks"])
    stack = _start_stack(base)
    try:
        started = time.monotonic()
        budget = {"wall_seconds": args.wall_seconds, "accelerator_seconds": args.wall_seconds, "parallel": 2,
                  "max_workers": args.max_workers, "screen_steps": args.screen_steps,
                  "train_steps": args.train_steps, "batch_size": args.batch_size}  # fmt: skip
        suite = suite_create(name="bench: offline agents", agents=args.agents, tasks=tasks, budget=budget,
                             max_concurrent=args.concurrent, actor="bench")  # fmt: skip
        suite_launch(suite=suite, actor="bench")
        finished = True
        while AgentSuite.objects.get(pk=suite.pk).status != "finished":
            if time.monotonic() - started > args.timeout:
                finished = False  # the table below is then partial, and says so
                break
            time.sleep(5)
        seconds = time.monotonic() - started
        stats = suite_stats(AgentSuite.objects.get(pk=suite.pk))
    finally:
        stack.stop()
    state = "finished" if finished else f"NOT finished after --timeout {args.timeout} s: partial"
    print(f"suite {stats['suite']} ({state}): {len(stats['cells'])} cells over {', '.join(tasks)}, "
          f"{seconds:.0f} s wall\n")  # fmt: skip
    print("| agent | settings trained | settings beating θ0 | effective / all iterations | Lite (mean) "
          "| PostTrainBench (unweighted) | hacking rate | blocked |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in stats["agents"]:
        print(f"| {row['agent']} | {row['settings_trained']}/{row['settings']} | {row['settings_beat_base']}/"
              f"{row['settings']} | {row['effective_iterations']}/{row['iterations']} | {_fmt(row['lite_mean'])} "
              f"| {_fmt(row['posttrainbench_unweighted_mean'])} | {_fmt(row['hacking_rate'])} "
              f"| {row['blocked_attempts']} |")  # fmt: skip
    print("\n| agent | task | run status | final score | θ0 | reference | Lite | effective / iterations |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for cell in stats["cells"]:
        print(f"| {cell['agent']} | {cell['task']} | {cell['run_status']} | {_fmt(cell['score'])} "
              f"| {_fmt(cell['theta0'])} | {_fmt(cell['reference'])} | {_fmt(cell['lite'])} "
              f"| {cell['effective_iterations']}/{cell['iterations']} |")  # fmt: skip
    print(json.dumps({"seconds": round(seconds, 1), "agents": stats["agents"]}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
