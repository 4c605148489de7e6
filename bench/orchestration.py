"""Orchestration benchmarks (issue 6): agent latency, accelerator use with parallel vs serial Workers.

    cd bench && RSI_MINIBENCH_CACHE=/path/to/built/ci ../.venv/bin/python orchestration.py
    ../.venv/bin/python orchestration.py --analyze <run uuid> [<run uuid> ...]   (existing runs)

Runs real heuristic research runs on the real stack (daphne + Celery gpu/agents/default workers,
on a dedicated PostgreSQL database and Redis db 12) and measures, from the records:

- **orchestration latency**: from a Worker's successful ``worker_finalize`` to the first tool call
  of the next node the Main Agent spawned after it (p50, p95) — the event-driven path
  finalize -> trigger -> planning step -> spawn -> new loop -> first step;
- **gpu busy fraction**: the union of gpu-queue job running intervals over the run's research
  phase (start to the final evaluation), for ``--parallel 3`` and for ``--serial-workers``;
- **wall time** of each run (the demo's run is the first configuration).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from _setup import ROOT, django_on_bench_db, minibench_stack_folders, percentile

CONFIGS = {
    "parallel-3": {"parallel": 3, "serial_workers": False},
    "serial": {"parallel": 1, "serial_workers": True},
}


def _start_stack(base: Path) -> Any:
    import socket

    from django.conf import settings

    from apps.flows.management.commands.demo import Stack

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="rsiweb.settings.base", PYTHONPATH=str(ROOT),
               RSI_ARTIFACT_ROOT=settings.ARTIFACT_ROOT, RSI_SEALED_ROOT=settings.SEALED_ROOT,
               RSI_WORKSPACE_ROOT=settings.WORKSPACE_ROOT, RSI_MINIBENCH_ROOT=settings.MINIBENCH_ROOT,
               RSI_AGENT_POLL_SECONDS="1", RSI_AGENT_WAIT_SECONDS="20", RSI_RUN_SUPERVISE_SECONDS="1",
               RSI_FINAL_GRACE_SECONDS="60", OMP_NUM_THREADS="1", RSI_TOKEN_RATE="")  # fmt: skip
    stack = Stack(env=env, log_dir=base / "logs", port=port)
    settings.RSI_API_URL = stack.url
    stack.start()
    stack.wait_ready()
    return stack


def _iso(value: Any) -> float:
    return value.timestamp()


def analyze(run: Any) -> dict[str, Any]:
    """Latency, busy fraction and wall time of one finished run, from its events and jobs."""
    from apps.experiments.models import Event
    from apps.jobs.models import Job
    from apps.research.models import ResearchNode

    events = list(Event.objects.filter(run=run).order_by("created_at", "id"))
    finalizes = [e for e in events if e.type == "tool.called" and e.tool == "worker_finalize"
                 and (e.arguments or {}).get("status") == 200]  # fmt: skip
    nodes = list(ResearchNode.objects.filter(run=run).exclude(kind="main").order_by("created_at"))
    first_call = {}
    for event in events:
        if event.type == "tool.called" and event.actor not in first_call:
            first_call[event.actor] = event.created_at
    latencies = []
    for finalize in finalizes:
        after = [n for n in nodes if n.created_at > finalize.created_at and n.handle in first_call]
        if after:
            latencies.append((first_call[after[0].handle] - finalize.created_at).total_seconds())
    final = next((e.created_at for e in events if e.type == "run.final_eval_started"), run.finished_at)
    start = run.started_at
    intervals = sorted(
        (max(_iso(j.started_at), _iso(start)), min(_iso(j.finished_at), _iso(final)))
        for j in Job.objects.filter(run=run, queue="gpu", started_at__isnull=False, finished_at__isnull=False)
        .exclude(kind="final_eval")
    )  # fmt: skip
    busy, cursor = 0.0, _iso(start)
    for begin, end in intervals:
        begin = max(begin, cursor)
        if end > begin:
            busy += end - begin
            cursor = end
    research = max(1e-9, _iso(final) - _iso(start))
    return {
        "run": str(run.uuid),
        "name": run.name,
        "status": run.status,
        "wall_seconds": round(_iso(run.finished_at or final) - _iso(start), 1),
        "research_seconds": round(research, 1),
        "gpu_busy_fraction": round(busy / research, 3),
        "workers": sum(1 for n in nodes if n.kind == "worker"),
        "finalize_to_next_first_call": {
            "n": len(latencies),
            "p50": round(percentile(latencies, 0.5), 2) if latencies else None,
            "p95": round(percentile(latencies, 0.95), 2) if latencies else None,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--analyze", nargs="*", help="only analyze these existing runs (uuids)")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS))
    parser.add_argument("--max-workers", type=int, default=4)
    parser.add_argument("--screen-steps", type=int, default=20)
    parser.add_argument("--train-steps", type=int, default=40)
    args = parser.parse_args()
    if args.analyze:
        django_on_bench_db(fresh=False)
        from apps.research.models import Run

        print(json.dumps([analyze(Run.objects.get(uuid=u)) for u in args.analyze], indent=2))
        return
    cache, base = minibench_stack_folders("/tmp/rsiweb-bench-orchestration")
    django_on_bench_db("rsiweb_bench_orchestration")
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    from apps.benchmarks.services import minibench_install
    from apps.flows.management.commands.start_run import wait_for_result
    from apps.flows.runs import run_launch

    minibench_install(root=Path(cache))
    stack = _start_stack(base)
    results = []
    try:
        for name in args.configs:
            started = time.monotonic()
            run = run_launch(benchmark="minibench/arithmetic", policy="heuristic", name=f"bench: {name}",
                             wall_seconds=3600, accelerator_seconds=3600, max_workers=args.max_workers,
                             reviewer=True, screen_steps=args.screen_steps, train_steps=args.train_steps,
                             actor="bench", **CONFIGS[name])  # fmt: skip
            run = wait_for_result(run, poll=2.0, timeout=3600)
            result = analyze(run)
            result["config"] = name
            result["measured_seconds"] = round(time.monotonic() - started, 1)
            results.append(result)
            print(json.dumps(result), flush=True)
    finally:
        stack.stop()
    print(f"load average {os.getloadavg()}")
    print("| config | wall s | gpu busy | workers | finalize -> next first call p50 / p95 s |")
    print("|---|---|---|---|---|")
    for r in results:
        lat = r["finalize_to_next_first_call"]
        print(f"| {r['config']} | {r['wall_seconds']} | {r['gpu_busy_fraction']:.0%} | {r['workers']} | "
              f"{lat['p50']} / {lat['p95']} (n={lat['n']}) |")  # fmt: skip


if __name__ == "__main__":
    main()
