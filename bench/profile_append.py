"""Where a single append's time goes on the server side: the request path in one process, profiled.

    REDIS_URL=redis://127.0.0.1:6379/6 .venv/bin/python bench/profile_append.py [--calls 2000] [--top 40]

bench/api_vs_mlflow.py measures the append against its floor (one INSERT and COMMIT behind the
same server) over HTTP. This script takes the HTTP server away: it calls both views through
Django's test client (the same middleware, handler and views, in this process), interleaved in
slices, and prints each one's p50 and CPU per call, the SQL statements of one call, and a CPU-time
cProfile of the measured calls. ``--points 1000`` measures the batched append, ``--list 1000``
the 1,000-record listing instead. The world is api_vs_mlflow's (one running run, Workers with
tokens, their experiments) on the same database, re-created.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import api_vs_mlflow as bench  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="appends and floor calls, each")
    parser.add_argument("--rounds", type=int, default=4, help="alternating slices")
    parser.add_argument("--top", type=int, default=40, help="functions of the profile to print")
    parser.add_argument("--points", type=int, default=1, help="points per append (1,000: the batched append)")
    parser.add_argument(
        "--list",
        type=int,
        default=0,
        metavar="N",
        help="profile GET /api/v1/experiments/?limit=N (N records) instead of the append",
    )
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() after set-up, as the server (rsiweb/asgi.py) does at start-up")  # fmt: skip
    args = parser.parse_args()

    os.environ["RSI_TOKEN_RATE"] = "10000000/min"  # in the path, never refusing (as api_vs_mlflow)
    os.environ["RSI_LOG_LEVEL"] = "WARNING"
    bench.our_side_fresh()
    world = bench.build_ours("http://testserver", list_size=args.list, history=0)

    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, override_settings

    settings.ALLOWED_HOSTS = ["*"]
    if args.gc_freeze:
        gc.freeze()
    token, handle = world.appenders[0]
    client = Client(headers={"authorization": f"Bearer {token}"})
    step = iter(range(10**9))

    def append() -> None:
        points = [{"key": "loss", "step": next(step), "value": random.random()} for _ in range(args.points)]
        answer = client.post("/api/v1/tools/experiment_log_metrics", {"experiment": handle, "points": points},
                             content_type="application/json")  # fmt: skip
        if answer.status_code != 200 or answer.json()["logged"] != args.points:
            raise RuntimeError(answer.content[:500])

    lister = Client(headers={"authorization": f"Bearer {world.lister}"})

    def listing() -> None:
        answer = lister.get("/api/v1/experiments/", {"limit": args.list})
        if answer.status_code != 200 or len(answer.json()["results"]) != args.list:
            raise RuntimeError(answer.content[:500])

    measured = listing if args.list else append
    name = "listing" if args.list else "append"

    def floor() -> None:
        point = {"key": "loss", "step": next(step), "value": random.random()}
        answer = client.post("/bench/floor", point, content_type="application/json")
        if answer.status_code != 200:
            raise RuntimeError(answer.content[:500])

    with override_settings(ROOT_URLCONF="bench._floor_urls"):
        for _ in range(20):  # warm: compiled schemas, the token cache, the experiment's uuid
            measured()
            floor()
        with CaptureQueriesContext(connection) as queries:
            measured()
        print(f"one {name}: {len(queries)} SQL statements")
        for query in queries.captured_queries:
            print(f"  {query['sql'][:150]}")

        times: dict[str, list[float]] = {name: [], "floor": []}
        cpu: dict[str, float] = {name: 0.0, "floor": 0.0}
        per_round = args.calls // args.rounds
        for r in range(args.rounds):
            for which, call in ((name, measured), ("floor", floor))[:: 1 if r % 2 == 0 else -1]:
                started_cpu = time.process_time()
                for _ in range(per_round):
                    t = time.perf_counter()
                    call()
                    times[which].append(time.perf_counter() - t)
                cpu[which] += time.process_time() - started_cpu
        print(f"\n{'':8s} {'p50 ms':>8s} {'mean ms':>8s} {'cpu ms/call':>12s}  (n={per_round * args.rounds} each)")
        for which, values in times.items():
            print(f"{which:8s} {statistics.median(values) * 1000:8.3f} {statistics.mean(values) * 1000:8.3f}"
                  f" {cpu[which] / len(values) * 1000:12.3f}")  # fmt: skip
        print(f"{name}/floor p50 {statistics.median(times[name]) / statistics.median(times['floor']):.2f}x")

        profile = cProfile.Profile(time.process_time)  # CPU: what Python costs, not the waits
        profile.enable()
        for _ in range(per_round):
            measured()
        profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())
    bench.flush_redis()


if __name__ == "__main__":
    main()
