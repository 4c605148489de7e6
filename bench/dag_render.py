"""Time to first render of a 2,000-node research DAG on the run page, in headless Chromium.

    REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python bench/dag_render.py [--nodes 2000 --loads 5] [--services]

Builds one run whose research DAG has ``--nodes`` Workers and Reviewers (each Worker takes
context from one or two recent Workers, a Reviewer every ~8 Workers scopes one to three of
them, decisions label a fifth of the nodes), serves it with daphne on a fresh database, signs
in with Debian's Chromium and loads the run page ``--loads`` times. For each load it reports,
from the page's own clock (ms since navigation start):

- ``snapshot``: the websocket snapshot arrived (server read + transfer + JSON parse);
- ``layout``: the elements of the first frame were added and placed (layered.js above 250
  nodes, dagre below);
- ``first render``: the first frame drawn after that layout — the figure the target is about.
  A large graph's first frame holds the elements around the first view (run.js ``fillGraph``);
  the count it drew is printed beside it;
- ``complete``: the first frame with every node and edge of the snapshot (the rest is added in
  slices after the first frame).

Target: 2,000 nodes drawn in under 2 s.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _setup import django_on_bench_db, percentile  # noqa: E402


def build(nodes: int, seed: int) -> tuple[str, str]:
    """A run with a ``nodes``-node DAG and a viewer; returns (run uuid, username)."""
    from django.contrib.auth.models import Group, User

    from apps.research.choices import EdgeKind, NodeKind, RunStatus
    from apps.research.models import Decision, ResearchEdge, ResearchNode
    from apps.research.services import run_set_status
    from tests.factories import make_run

    rng = random.Random(seed)
    run = make_run(name=f"dag-{nodes}")
    run = run_set_status(run=run, status=RunStatus.RUNNING, actor="bench")
    decisions = Decision.objects.bulk_create(
        Decision(run=run, kind=rng.choice(["branch", "verify", "revise", "continue"]), trigger="worker_finalize",
                 rationale=f"decision {i}")
        for i in range(nodes // 5)
    )  # fmt: skip
    rows, workers = [], []
    for i in range(nodes):
        reviewer = i % 9 == 8  # every ninth node; the first Workers come before any Reviewer
        kind = NodeKind.REVIEWER if reviewer else NodeKind.WORKER
        rows.append(
            ResearchNode(
                run=run,
                kind=kind,
                handle=f"{kind}_{i + 1:04d}",
                task=f"{kind} {i}: " + "hypothesis " * rng.randint(2, 12),
                status=rng.choice(["active", "finalized", "finalized", "cancelled"]),
                created_by_decision=decisions[i // 5] if i % 5 == 0 and i // 5 < len(decisions) else None,
            )
        )
    created = ResearchNode.objects.bulk_create(rows)
    edges = []
    for node in created:
        if node.kind == NodeKind.WORKER:
            if workers:
                # Context from one recent Worker, sometimes two (a merge of branches).
                for up in rng.sample(workers[-12:], k=min(len(workers[-12:]), 1 if rng.random() < 0.85 else 2)):
                    edges.append(ResearchEdge(run=run, upstream=up, downstream=node, kind=EdgeKind.CONTEXT))
            workers.append(node)
        else:
            for up in rng.sample(workers[-10:], k=rng.randint(1, 3)):
                edges.append(ResearchEdge(run=run, upstream=up, downstream=node, kind=EdgeKind.REVIEW_SCOPE))
    ResearchEdge.objects.bulk_create(edges)
    user = User.objects.create_user("bench-viewer", password="bench-password-123")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    print(f"built run {run.uuid}: {len(created)} nodes, {len(edges)} edges, {len(decisions)} decisions")
    return str(run.uuid), user.get_username()


def build_via_services(nodes: int, seed: int) -> tuple[str, str]:
    """The same shape of DAG written through the services the Main Agent's tools call.

    ``worker_add`` (context in-edges, the parallel-Worker limit), ``reviewer_add`` (review
    scope), ``decision_record`` for a fifth of the nodes and ``worker_finalize`` / ``node_finalize``
    for all but the last few: every node, edge and decision with its hash-chained event and live
    event, as a real run writes them. Slower to build than ``build`` (one transaction per call).
    """
    from django.contrib.auth.models import Group, User

    from apps.flows.agent_reports import worker_finalize
    from apps.research.choices import RunStatus
    from apps.research.services import (
        decision_record,
        node_finalize,
        reviewer_add,
        run_set_status,
        worker_add,
    )
    from tests.factories import make_run

    rng = random.Random(seed)
    run = make_run(name=f"dag-{nodes}-services", max_parallel_workers=4)
    run = run_set_status(run=run, status=RunStatus.RUNNING, actor="bench")
    workers: list = []
    active: list = []
    made = decisions = 0
    started = time.monotonic()
    for i in range(nodes):
        decision = None
        if i % 5 == 0:
            kind = rng.choice(["branch", "verify", "revise", "continue"])
            decision = decision_record(run=run, kind=kind, trigger="worker_finalize", rationale=f"decision {i}")
            decisions += 1
        task = "hypothesis " * rng.randint(2, 12)
        if i % 9 == 8 and workers:
            scope = rng.sample(workers[-10:], k=min(len(workers[-10:]), rng.randint(1, 3)))
            reviewer = reviewer_add(run=run, question=f"review {i}: {task}", scope=scope, decision=decision)
            node_finalize(node=reviewer, summary=f"reviewed {len(scope)}", experiments=[], actor=reviewer.handle)
        else:
            recent = workers[-12:]
            ups = rng.sample(recent, k=min(len(recent), 1 if rng.random() < 0.85 else 2))
            while len(active) >= 3:
                done = active.pop(0)
                worker_finalize(node=done, summary=f"finished {done.handle}", experiments=[], actor=done.handle)
            worker = worker_add(run=run, task=f"worker {i}: {task}", predecessors=ups, decision=decision)
            workers.append(worker)
            active.append(worker)
        made += 1
    user = User.objects.create_user("bench-viewer", password="bench-password-123")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    print(f"built run {run.uuid} through the services: {made} nodes, {decisions} decisions "
          f"in {time.monotonic() - started:.0f} s")  # fmt: skip
    return str(run.uuid), user.get_username()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--screenshot", help="save a PNG of the last load here")
    parser.add_argument(
        "--services", action="store_true", help="write the DAG through the services (build_via_services)"
    )
    args = parser.parse_args()

    django_on_bench_db("rsiweb_bench_dashboard")
    from playwright.sync_api import sync_playwright

    from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS, log_in, start_server

    run_uuid, username = (build_via_services if args.services else build)(args.nodes, args.seed)
    from django.conf import settings

    server, base = start_server(
        settings.DATABASES["default"]["NAME"],
        log_path=Path("/tmp/bench-dag-daphne.log"),
        settings_module="rsiweb.settings.base",
    )
    rows = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            log_in(page, base, username, "bench-password-123")
            for load in range(args.loads + 1):  # the first load warms caches and is not counted
                started = time.monotonic()
                page.goto(f"{base}/runs/{run_uuid}/")
                page.wait_for_function("window.rsiDagRendered !== undefined", timeout=120_000)
                wall = (time.monotonic() - started) * 1000
                page.wait_for_function("window.rsiDagComplete !== undefined", timeout=120_000)
                timing = page.evaluate(
                    """() => ({
                        snapshot: window.rsiSnapshotAt,
                        layout: window.rsiDagLayoutMs,
                        rendered: window.rsiDagRendered,
                        first: window.rsiDagFirstFrame,
                        complete: window.rsiDagComplete,
                        nodes: window.rsiGraphs.dag.nodes().length,
                        edges: window.rsiGraphs.dag.edges().length,
                        load: performance.getEntriesByType("navigation")[0].loadEventEnd,
                        wall: 0,
                    })"""
                )
                print(
                    f"load {load}{' (warm-up)' if load == 0 else ''}: "
                    f"{timing['nodes']} nodes, {timing['edges']} edges; "
                    f"snapshot {timing['snapshot']:.0f} ms, layout {timing['layout']:.0f} ms, "
                    f"first render {timing['rendered']:.0f} ms "
                    f"({timing['first']['nodes']} nodes, {timing['first']['edges']} edges; wall {wall:.0f} ms), "
                    f"complete {timing['complete']:.0f} ms"
                )
                timing["wall"] = wall
                if load:
                    rows.append(timing)
            if args.screenshot:
                page.wait_for_timeout(500)
                page.screenshot(path=args.screenshot)
            browser.close()
            if errors:
                print("page errors:", errors)
    finally:
        server.terminate()
        server.wait(timeout=10)
    rendered = [r["rendered"] for r in rows]
    print(
        f"\n{args.nodes} nodes, {args.loads} loads: first render p50 {statistics.median(rendered):.0f} ms, "
        f"p95 {percentile(rendered, 0.95):.0f} ms, max {max(rendered):.0f} ms; "
        f"complete p50 {statistics.median([r['complete'] for r in rows]):.0f} ms, "
        f"p95 {percentile([r['complete'] for r in rows], 0.95):.0f} ms; "
        f"layout p50 {statistics.median([r['layout'] for r in rows]):.0f} ms; "
        f"snapshot p50 {statistics.median([r['snapshot'] for r in rows]):.0f} ms "
        f"(target: drawn in under 2000 ms)"
    )
    for key, label in (("load", "page load event"), ("wall", "navigation to first render, wall")):
        values = [r[key] for r in rows]
        print(f"{label}: p50 {statistics.median(values):.0f} ms, p95 {percentile(values, 0.95):.0f} ms, "
              f"max {max(values):.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
