"""Event appends per second, 1 and 8 concurrent writer processes, with and without the hash chain.

    .venv/bin/python bench/event_log.py [--seconds 5]

"Unchained" inserts the same Event row through the same ORM path but never seals it into a
chain (it goes to a chain of its own that nobody seals): the difference is the chain's cost —
the chain look-up, the sealing transaction and its lock.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

from _setup import django_on_bench_db


def writer(mode: str, run_uuid: str, seconds: float, barrier, out) -> None:
    from django.db import connection
    from django.utils import timezone

    connection.close()  # never share the parent's socket across fork
    from apps.experiments.events import event_append, redact
    from apps.experiments.models import Event, EventChain
    from apps.research.models import Run

    run = Run.objects.get(uuid=run_uuid)
    unchained = EventChain.objects.get(key="bench-unchained")  # never sealed
    barrier.wait()
    count = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if mode == "chained":
            event_append(run=run, type="bench.event", actor="bench", role="worker", arguments={"i": count})
        else:
            Event(
                chain=unchained,
                run=run,
                created_at=timezone.now(),
                type="bench.event",
                actor="bench",
                role="worker",
                arguments=redact({"i": count}),
                content_sha256="0" * 64,
            ).save(force_insert=True)
        count += 1
    out.put(count)


def measure(mode: str, writers: int, run_uuid: str, seconds: float) -> float:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(writers)
    out = ctx.Queue()
    procs = [ctx.Process(target=writer, args=(mode, run_uuid, seconds, barrier, out)) for _ in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return sum(out.get() for _ in procs) / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0, help="per mode and writer count")
    parser.add_argument("--slices", type=int, default=4, help="alternating slices per mode")
    args = parser.parse_args()
    django_on_bench_db()
    from django.db import connection

    from tests.factories import make_run

    run = make_run(name="bench")
    from apps.experiments.models import EventChain

    EventChain.objects.create(key="bench-unchained")
    connection.close()
    print(f"{'writers':>8} {'unchained/s':>12} {'chained/s':>10} {'chained/unchained':>18}")
    for writers in (1, 8):
        # Alternating slices, so both modes see the same disk and CPU conditions (commit latency
        # on this machine swings several-fold with what else is running).
        slice_seconds = args.seconds / args.slices
        plain = chained = 0.0
        for _ in range(args.slices):
            plain += measure("unchained", writers, str(run.uuid), slice_seconds) / args.slices
            chained += measure("chained", writers, str(run.uuid), slice_seconds) / args.slices
        print(f"{writers:>8} {plain:>12.0f} {chained:>10.0f} {chained / plain:>18.2f}")
    from apps.experiments.events import chain_key, chain_verify

    report = chain_verify(chain_key(run))
    print(f"chain after the run: {report.events} events, ok={report.ok}")


if __name__ == "__main__":
    main()
