"""Event-to-browser latency of the run page's live updates at a steady event rate.

    REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python bench/live_latency.py [--rates 100 500 --seconds 10]

The whole path, as in production: a publisher *process* (as a Celery worker or an agent step
would) calls ``apps.live.events.publish_on_commit`` at a steady rate -> channels_redis ->
daphne's RunConsumer -> the websocket -> Debian's Chromium, where the run page (live.js +
run.js) applies the event to its state. Each payload carries the publisher's wall clock at the
call; the page stamps two moments on the same machine's clock:

- ``applied``: the event is in the page's state and its redraw is scheduled;
- ``next frame``: the first animation frame after that, i.e. when the change can be on screen.

The events are the mix a busy run sends: job progress (60 %), experiment updates (25 %) and
research-node updates (15 %), spread over a 40-node DAG with 120 experiments and 4 running jobs.

Target: p95 under 150 ms at 500 events/s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _setup import django_on_bench_db, percentile  # noqa: E402

PASSWORD = "bench-password-123"


def build(seed: int) -> dict:
    """A running run with a DAG, experiments and running jobs, and a viewer; returns their ids."""
    from django.contrib.auth.models import Group, User
    from django.utils import timezone

    from apps.experiments.models import Experiment
    from apps.jobs.models import Job
    from apps.research.choices import NodeKind, RunStatus
    from apps.research.services import node_create, run_set_status
    from tests.factories import make_run

    rng = random.Random(seed)
    run = make_run(name="latency")
    run = run_set_status(run=run, status=RunStatus.RUNNING, actor="bench")
    workers = []
    for i in range(40):
        upstream = [rng.choice(workers)] if workers and rng.random() < 0.8 else []
        workers.append(node_create(run=run, kind=NodeKind.WORKER, task=f"hypothesis {i}", upstream=upstream))
    experiments = Experiment.objects.bulk_create(
        Experiment(run=run, handle=f"exp_{i + 1:04d}", owner=rng.choice(workers), kind="train_eval",
                   input_checkpoint=run.base_checkpoint, action={"recipe": "sft"}, status="succeeded",
                   feedback_score=round(rng.random(), 3))
        for i in range(120)
    )  # fmt: skip
    jobs = [
        Job.objects.create(run=run, experiment=experiments[-1 - i], kind="train", queue="gpu", status="running",
                           worker=f"gpu@bench-{i}", started_at=timezone.now())
        for i in range(4)
    ]  # fmt: skip
    user = User.objects.create_user("bench-viewer", password=PASSWORD)
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    return {
        "run": str(run.uuid),
        "nodes": [str(w.uuid) for w in workers],
        "experiments": [str(e.uuid) for e in experiments],
        "jobs": [str(j.uuid) for j in jobs],
    }


def _events(world: dict, rng: random.Random):
    """The event mix of a busy run, forever."""
    while True:
        pick = rng.random()
        if pick < 0.6:
            event, payload = "job.progress", {"uuid": rng.choice(world["jobs"]), "progress": round(rng.random(), 3)}
        elif pick < 0.85:
            event = "experiment.updated"
            payload = {"uuid": rng.choice(world["experiments"]), "feedback_score": round(rng.random(), 3)}
        else:
            event, payload = (
                "node.updated",
                {"uuid": rng.choice(world["nodes"]), "status": rng.choice(["active", "finalized"])},
            )
        yield event, payload


def publish(world: dict, rate: float, seconds: float, seed: int, how: str) -> None:
    """The publisher process: ``rate`` events per second for ``seconds``, on a fixed schedule.

    ``service``: apps.live.events.publish_on_commit, the path every service takes (outside a
    transaction it sends at once). ``loop``: the same message through the same channel layer
    from one event loop that stays up, which isolates the delivery path from the per-call
    cost of publish_on_commit (async_to_sync starts a loop, and channels_redis a connection,
    per call: about 290 calls/s for one idle process here).
    """
    import asyncio

    from channels.layers import get_channel_layer
    from django.core.serializers.json import DjangoJSONEncoder

    from apps.live.events import LIVE_EVENT_TYPE, publish_on_commit
    from apps.live.groups import run_group

    events = _events(world, random.Random(seed))
    group = run_group(world["run"])
    count = int(rate * seconds)
    late = 0

    def pace(started: float, n: int) -> float:
        return started + n / rate - time.monotonic()

    if how == "service":
        started = time.monotonic()
        for n in range(count):
            wait = pace(started, n)
            if wait > 0:
                time.sleep(wait)
            elif wait < -0.05:
                late += 1
            event, payload = next(events)
            payload["sent_at_ms"] = time.time() * 1000
            publish_on_commit(group, event, payload)
    else:

        async def run() -> int:
            layer = get_channel_layer()
            behind = 0
            begun = time.monotonic()
            for n in range(count):
                wait = pace(begun, n)
                if wait > 0:
                    await asyncio.sleep(wait)
                elif wait < -0.05:
                    behind += 1
                event, payload = next(events)
                payload["sent_at_ms"] = time.time() * 1000
                body = json.loads(json.dumps(payload, cls=DjangoJSONEncoder))
                await layer.group_send(group, {"type": LIVE_EVENT_TYPE, "event": event, "payload": body})
            return behind

        started = time.monotonic()
        late = asyncio.run(run())
    took = time.monotonic() - started
    print(json.dumps({"sent": count, "seconds": took, "rate": count / took, "late_over_50ms": late}))


def _use_layer(layer: str) -> None:
    """Point this process's channel layer at the layer the server uses (before first use)."""
    if layer == "pubsub":
        from channels.layers import channel_layers
        from django.conf import settings

        channel_layers.backends = {}  # drop a core layer made while Django started
        settings.CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                "CONFIG": {"hosts": [settings.REDIS_URL]},
            }
        }


PROBE = """() => {
    window.__applied = []; window.__painted = []; window.__snapshots = 0;
    const handlers = window.rsiRunSocket.handlers;
    if (!handlers.__counted) {
        const snapshot = handlers.snapshot;
        handlers.snapshot = (data) => { window.__snapshots += 1; snapshot(data); };
        handlers.__counted = true;
    }
    window.rsiProbe = (event, payload) => {
        if (payload.sent_at_ms === undefined) return;
        const sent = payload.sent_at_ms;
        window.__applied.push(performance.timeOrigin + performance.now() - sent);
        requestAnimationFrame(() => window.__painted.push(performance.timeOrigin + performance.now() - sent));
    };
}"""


def summary(values: list[float]) -> str:
    return f"p50 {statistics.median(values):6.1f}  p95 {percentile(values, 0.95):6.1f}  max {max(values):7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 500])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-publisher", type=float, default=100, help="events/s per publisher process")
    parser.add_argument("--publisher", choices=["service", "loop"], default="service", help="see publish()")
    parser.add_argument(
        "--layer", choices=["core", "pubsub"], default="core",
        help="channels_redis layer: the settings' core layer, or its pub/sub layer (bench/_settings_pubsub.py)",
    )  # fmt: skip
    parser.add_argument("--publish", help=argparse.SUPPRESS)  # internal: run as the publisher
    args = parser.parse_args()

    if args.publish:
        django_on_bench_db("rsiweb_bench_dashboard", fresh=False)
        _use_layer(args.layer)
        world, rate = json.loads(args.publish), args.rates[0]
        publish(world, rate, args.seconds, args.seed, args.publisher)
        return

    django_on_bench_db("rsiweb_bench_dashboard")
    _use_layer(args.layer)
    from django.conf import settings
    from playwright.sync_api import sync_playwright

    from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS, log_in, start_server

    world = build(args.seed)
    server, base = start_server(
        settings.DATABASES["default"]["NAME"], log_path=Path("/tmp/bench-latency-daphne.log"),
        settings_module="rsiweb.settings.base" if args.layer == "core" else "bench._settings_pubsub",
    )  # fmt: skip
    results = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            log_in(page, base, "bench-viewer", PASSWORD)
            page.goto(f"{base}/runs/{world['run']}/")
            page.wait_for_selector("body[data-live='live']", timeout=60_000)
            page.wait_for_function("window.rsiDagRendered !== undefined", timeout=60_000)
            page.wait_for_timeout(3000)  # charts loaded, page idle
            for rate in args.rates:
                page.evaluate(PROBE)
                # Several publisher processes, as several workers and agent loops publish at once;
                # one process's publish_on_commit (async_to_sync + a channels_redis group_send per
                # event) tops out near 150 events/s on the 2-core development machine.
                count = max(1, math.ceil(rate / args.per_publisher))
                publishers = [
                    subprocess.Popen(
                        [
                            sys.executable,
                            __file__,
                            "--publish",
                            json.dumps(world),
                            "--rates",
                            str(rate / count),
                            "--seconds",
                            str(args.seconds),
                            "--seed",
                            str(args.seed + k),
                            "--publisher",
                            args.publisher,
                            "--layer",
                            args.layer,
                        ],
                        stdout=subprocess.PIPE,
                        text=True,
                        env=os.environ,
                    )  # fmt: skip
                    for k in range(count)
                ]
                reports = [
                    json.loads(p.communicate(timeout=args.seconds * 10)[0].strip().splitlines()[-1]) for p in publishers
                ]
                sent = {
                    "sent": sum(r["sent"] for r in reports),
                    "rate": sum(r["rate"] for r in reports),
                    "late_over_50ms": sum(r["late_over_50ms"] for r in reports),
                    "publishers": count,
                }
                page.wait_for_timeout(3000)  # stragglers
                applied = page.evaluate("window.__applied")
                resyncs = page.evaluate("window.__snapshots")
                painted = page.evaluate("window.__painted")
                # The first second warms the path (connections, JIT); it is not counted.
                skip = int(rate)
                results.append((rate, sent, len(applied), applied[skip:], painted[skip:], resyncs))
            browser.close()
            if errors:
                print("page errors:", errors)
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(
        f"\nlayer: {args.layer}; publisher: {args.publisher}; load average {os.getloadavg()[0]:.1f} at the end; "
        "latencies in ms, first second not counted"
    )
    for rate, sent, received, applied, painted, resyncs in results:
        print(
            f"{rate:5.0f}/s target, {sent['rate']:6.1f}/s sent by {sent['publishers']} processes "
            f"({sent['sent']} events, "
            f"{sent['late_over_50ms']} sent >50 ms late), {received} received, {resyncs} reconnections\n"
            f"        applied     {summary(applied)}\n"
            f"        next frame  {summary(painted)}"
        )
    print("target: p95 < 150 ms at 500 events/s")


if __name__ == "__main__":
    main()
