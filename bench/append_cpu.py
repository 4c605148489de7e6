"""Where a single append's cost lies next to the floor's: latency and CPU per call of each process.

    REDIS_URL=redis://127.0.0.1:6379/6 .venv/bin/python bench/append_cpu.py [--calls 2400]
        [--against PATH] [--env NAME=VALUE ...]

One client appends one point at a time (``experiment_log_metrics``, as bench/api_vs_mlflow.py's
"append one record, 1 client") and calls the floor (``POST /bench/floor``: one INSERT and COMMIT
behind the same server), in interleaved slices. Per call it prints the p50 latency and the CPU
time of the server process, of all of PostgreSQL's processes and of this client, read from the
kernel before and after each slice: at one client a call's latency is about the sum of those,
and with eight clients the machine's cores are the limit, so they tell which side to work on.

``--against PATH`` also serves the same calls from a second server running the code of another
checkout (``git worktree add PATH <commit>``), measured in the same slices: a before/after of a
change in one run. ``--env NAME=VALUE`` sets the environment of this checkout's server (say
``RSI_TOKEN_RATE_LEASE_SECONDS=0`` to compare it with the other's defaults).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import api_vs_mlflow as bench  # noqa: E402


@dataclass
class Side:
    name: str
    call: Callable[[Any, int], None]
    session: Any
    server: psutil.Process
    latencies: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # server, PostgreSQL, client


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:  # a PostgreSQL backend that ended meanwhile
            continue
        total += times.user + times.system
    return total


def postgres_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("postgres")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2400, help="calls per side")
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--against", type=Path, help="another checkout, served beside this one")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.env)

    bench.our_side_fresh()
    servers: dict[str, tuple[int, Any]] = {}
    try:
        port = bench.free_port()
        servers["append"] = (port, bench.start_rsiweb(port, 1, **overrides))
        if args.against:
            port = bench.free_port()
            servers[f"append ({args.against.name})"] = (port, bench.start_rsiweb(port, 1, root=args.against.resolve()))
        world = bench.build_ours("http://unused", list_size=0, history=0)
        sides = []
        for i, (name, (port, process)) in enumerate(servers.items()):
            # Each server's appends come from a Worker of its own, on its own experiment.
            mine = bench.OursWorld(**{**world.__dict__, "base": f"http://127.0.0.1:{port}"})
            mine.appenders = world.appenders[i : i + 1]
            ours = bench.Ours(mine, history=0, list_size=0, batch_size=1)
            sides.append(Side(name, ours.append, ours.appender(), psutil.Process(process.pid)))
        port, process = servers["append"]
        floor = bench.Floor(f"http://127.0.0.1:{port}")
        sides.append(Side("floor", floor.append, floor.session(), psutil.Process(process.pid)))
        for side in sides:  # warm: connections, caches, prepared statements, leases
            for i in range(300):
                side.call(side.session, i)
        me = psutil.Process()
        step = 10**6
        for r in range(args.slices):
            for side in sides if r % 2 == 0 else sides[::-1]:
                watched = [[side.server], postgres_processes(), [me]]
                before = [cpu_seconds(p) for p in watched]
                for _ in range(args.calls // args.slices):
                    step += 1
                    started = time.perf_counter()
                    side.call(side.session, step)
                    side.latencies.append(time.perf_counter() - started)
                for k, processes in enumerate(watched):
                    side.cpu[k] += cpu_seconds(processes) - before[k]
        report(sides)
    finally:
        for _, process in servers.values():
            bench.stop(process)


def report(sides: list[Side]) -> None:
    floor = statistics.median(sides[-1].latencies)
    floor_cpu = sum(sides[-1].cpu) / len(sides[-1].latencies)
    print(f"{'':24s} {'p50 ms':>7s} {'/floor':>7s}   CPU ms per call: {'server':>7s} {'postgres':>9s} {'client':>7s}"
          f" {'total':>7s} {'/floor':>7s}")  # fmt: skip
    for side in sides:
        n = len(side.latencies)
        p50 = statistics.median(side.latencies)
        server, postgres, client = (seconds / n * 1000 for seconds in side.cpu)
        total = server + postgres + client
        print(f"{side.name:24s} {p50 * 1000:7.2f} {p50 / floor:6.2f}x   {'':16s} {server:7.2f} {postgres:9.2f}"
              f" {client:7.2f} {total:7.2f} {total / (floor_cpu * 1000):6.2f}x")  # fmt: skip
    print(f"(n={len(sides[-1].latencies)} calls per side, load {bench.loadavg():.1f})")


if __name__ == "__main__":
    main()
