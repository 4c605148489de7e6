"""Agents of one run appending at once: how often their run's event chain is taken, and what it costs.

    REDIS_URL=redis://127.0.0.1:6379/6 .venv/bin/python bench/append_contention.py [--clients 8]
        [--calls 300] [--env NAME=VALUE ...]

Every event of a run is sealed into the run's one hash chain. An append that finds the chain being
sealed by another transaction inserts its event unsealed, and the event is sealed after that
transaction ends (apps.experiments.events). ``--clients`` Workers of one run each append one point
at a time to their own experiment (``experiment_log_metrics``, as bench/api_vs_mlflow.py's "append
one record, 8 clients"), against one ``manage.py serve``. It prints the throughput and p50, and,
from PostgreSQL's function statistics over the measured calls only: how many events went in
unsealed (and were sealed later by an UPDATE), and how many seals waited for the chain.
``--env RSI_EVENT_SEAL_BACKGROUND=0`` has each call seal its own event before it answers, as
before the background sealer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import api_vs_mlflow as bench  # noqa: E402

# The functions (and trigger) whose calls tell what happened to each append's event.
_COUNTED = ("rsiweb_event_append", "rsiweb_seal_chain_wait", "experiments_event_seal_once")


def function_calls(database: str) -> dict[str, int]:
    # An idle backend reports its statistics at most once a second, and what it holds back then only
    # after PostgreSQL's idle interval (10 s): wait past it, so every call made so far is counted.
    time.sleep(11.0)
    with psycopg.connect(f"{bench.PG}/{database}", autocommit=True) as conn:
        rows = conn.execute("SELECT funcname, calls FROM pg_stat_user_functions").fetchall()
    return {name: calls for name, calls in rows if name in _COUNTED}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--calls", type=int, default=300, help="appends per client")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.env)

    bench.our_side_fresh()
    with psycopg.connect(f"{bench.PG}/postgres", autocommit=True) as conn:
        # For the sessions that start from now on: the server's, whose calls are counted.
        conn.execute(f"ALTER DATABASE {bench.API_DB} SET track_functions = 'pl'")
    port = bench.free_port()
    server = bench.start_rsiweb(port, 1, **overrides)
    try:
        world = bench.build_ours("http://unused", list_size=0, history=0)
        world = bench.OursWorld(**{**world.__dict__, "base": f"http://127.0.0.1:{port}"})
        ours = bench.Ours(world, history=0, list_size=0, batch_size=1)
        sessions = [ours.appender() for _ in range(args.clients)]  # a Worker (and experiment) each
        for k, session in enumerate(sessions):  # warm: connections, prepared statements, leases
            for i in range(20):
                ours.append(session, 10**9 + k * 100 + i)
        latencies: list[float] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            mine = []
            for i in range(args.calls):
                started = time.perf_counter()
                ours.append(sessions[k], k * 10**6 + i)
                mine.append(time.perf_counter() - started)
            with lock:
                latencies.extend(mine)

        before = function_calls(bench.API_DB)
        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        after = function_calls(bench.API_DB)
    finally:
        bench.stop(server)
    calls = {name: after.get(name, 0) - before.get(name, 0) for name in _COUNTED}
    appends = calls["rsiweb_event_append"]
    print(f"{args.clients} clients, {len(latencies)} appends: {len(latencies) / wall:.0f} req/s, "
          f"p50 {statistics.median(latencies) * 1000:.2f} ms (load {bench.loadavg():.1f})")  # fmt: skip
    print(f"events appended {appends}; inserted unsealed and sealed later "
          f"{calls['experiments_event_seal_once']} ({calls['experiments_event_seal_once'] / max(appends, 1):.0%}); "
          f"seals that waited for the chain {calls['rsiweb_seal_chain_wait']}")  # fmt: skip


if __name__ == "__main__":
    main()
