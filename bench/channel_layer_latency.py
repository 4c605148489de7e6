"""Cross-process group_send -> receive latency of the channel layers rsiweb can run on.

A sender process (as a Celery worker would) group_sends timestamped messages at irregular
intervals; this process receives them on a channel in that group (as a web consumer would) and
reports the latency percentiles. Also the CPU an idle waiting receiver costs, which is what the
SQLite layer's polling trades for needing no server.

    .venv/bin/python bench/channel_layer_latency.py                    # SQLite only
    REDIS_URL=redis://127.0.0.1:6379/3 .venv/bin/python bench/channel_layer_latency.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django.utils.module_loading import import_string  # noqa: E402

SQLITE = "apps.live.layers.SQLiteChannelLayer"
REDIS = "channels_redis.core.RedisChannelLayer"


async def send_messages(backend: str, config: dict, group: str, count: int, interval: float) -> None:
    layer = import_string(backend)(**config)
    rng = random.Random(0)
    for n in range(count):
        # Irregular gaps, so sends do not fall into step with the receiver's poll.
        await asyncio.sleep(interval * rng.uniform(0.5, 1.5))
        await layer.group_send(group, {"type": "live.event", "n": n, "sent": time.time()})


async def measure(backend: str, config: dict, count: int, interval: float, warmup: int) -> dict:
    layer = import_string(backend)(**config)
    group = f"bench-{uuid.uuid4().hex}"
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    sender = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--send", backend, json.dumps(config), group, str(count), str(interval)
    )
    latencies = []
    for _ in range(count):
        message = await asyncio.wait_for(layer.receive(channel), 30)
        latencies.append((time.time() - message["sent"]) * 1000)
    await sender.wait()

    # What waiting costs: several receivers idle on empty channels for a few seconds.
    idle_receivers, idle_seconds = 10, 3.0
    cpu_before = time.process_time()
    waits = [asyncio.create_task(layer.receive(await layer.new_channel())) for _ in range(idle_receivers)]
    await asyncio.sleep(idle_seconds)
    cpu = time.process_time() - cpu_before
    for wait in waits:
        wait.cancel()
    await asyncio.gather(*waits, return_exceptions=True)

    await layer.flush()
    if hasattr(layer, "close_pools"):
        await layer.close_pools()
    measured = sorted(latencies[warmup:])
    return {
        "n": len(measured),
        "p50": statistics.median(measured),
        "p95": measured[int(0.95 * (len(measured) - 1))],
        "max": measured[-1],
        "idle_cpu_per_receiver_pct": 100 * cpu / idle_seconds / idle_receivers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.02, help="mean seconds between sends")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--send", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.send:
        backend, config, group, count, interval = args.send
        asyncio.run(send_messages(backend, json.loads(config), group, int(count), float(interval)))
        return

    with tempfile.TemporaryDirectory() as folder:
        runs = [("sqlite (poll 30 ms)", SQLITE, {"path": str(Path(folder) / "channels.sqlite3")})]
        if os.environ.get("REDIS_URL"):
            prefix = f"bench-{uuid.uuid4().hex[:8]}"
            runs.append(("channels_redis", REDIS, {"hosts": [os.environ["REDIS_URL"]], "prefix": prefix}))
        else:
            print("REDIS_URL not set: channels_redis skipped")
        print(f"{args.messages} messages, mean gap {args.interval * 1000:.0f} ms, first {args.warmup} not counted")
        print(f"{'layer':<20} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'idle CPU/receiver':>18}")
        for name, backend, config in runs:
            r = asyncio.run(measure(backend, config, args.messages, args.interval, args.warmup))
            print(
                f"{name:<20} {r['p50']:>8.1f} {r['p95']:>8.1f} {r['max']:>8.1f}"
                f" {r['idle_cpu_per_receiver_pct']:>17.2f}%"
            )


if __name__ == "__main__":
    main()
