"""Ancestor / descendant query latency on a generated experiment graph shaped like real runs.

    .venv/bin/python bench/lineage.py [--runs 1000 --per-run 100 --queries 2000]

About 1,000 runs of about 100 experiments: each new experiment continues one recent
experiment of its run (branching about 2), sometimes two (a merge, 5%), with depth capped at
50. Times the one-query selectors of apps.experiments.selectors on random experiments.
"""

from __future__ import annotations

import argparse
import random
import time

from _setup import django_on_bench_db, percentile


def build(runs: int, per_run: int, seed: int) -> list[int]:
    from django.db import connection

    from apps.experiments.models import Experiment, ExperimentEdge
    from apps.research import services as research_services
    from apps.research.choices import NodeKind
    from tests.factories import BenchmarkFactory, CheckpointFactory, make_run

    rng = random.Random(seed)
    benchmark = BenchmarkFactory()
    base = CheckpointFactory(is_base=True)
    all_ids: list[int] = []
    for r in range(runs):
        run = make_run(name=f"bench-{r}", benchmark=benchmark, base_checkpoint=base)
        worker = research_services.node_create(run=run, kind=NodeKind.WORKER, task="bench")
        experiments = Experiment.objects.bulk_create(
            Experiment(
                run=run,
                handle=f"exp_{i + 1:04d}",
                owner=worker,
                kind="train_eval",
                input_checkpoint=base,
                action={"recipe": "sft"},
            )
            for i in range(per_run)
        )
        depth = {}
        edges = []
        for i, exp in enumerate(experiments):
            if i == 0:
                depth[i] = 0
                continue
            # Continue a recent experiment (a small window gives branching ~2), capped at depth 50.
            eligible = [j for j in range(i) if depth[j] < 50]
            candidates = eligible[-4:]
            parents = (
                rng.sample(candidates, 2) if len(candidates) >= 2 and rng.random() < 0.05 else [rng.choice(candidates)]
            )
            depth[i] = 1 + max(depth[p] for p in parents)
            edges.extend(ExperimentEdge(parent=experiments[p], child=exp) for p in parents)
        ExperimentEdge.objects.bulk_create(edges)
        all_ids.extend(e.pk for e in experiments)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return all_ids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--per-run", type=int, default=100)
    parser.add_argument("--queries", type=int, default=2000)
    args = parser.parse_args()
    django_on_bench_db("rsiweb_bench_lineage")
    from apps.experiments import selectors

    started = time.perf_counter()
    ids = build(args.runs, args.per_run, seed=1)
    print(f"built {len(ids)} experiments in {time.perf_counter() - started:.0f} s")
    rng = random.Random(2)
    for name, query in (
        ("ancestors", selectors.experiment_ancestors),
        ("descendants", selectors.experiment_descendants),
    ):
        times, sizes = [], []
        for pk in rng.sample(ids, args.queries):
            t0 = time.perf_counter()
            rows = query(pk)
            times.append((time.perf_counter() - t0) * 1000)
            sizes.append(len(rows))
        print(
            f"{name:>12}: p50 {percentile(times, 0.5):6.2f} ms  p95 {percentile(times, 0.95):6.2f} ms  "
            f"max {max(times):6.2f} ms  mean size {sum(sizes) / len(sizes):5.1f}  max size {max(sizes)}"
        )


if __name__ == "__main__":
    main()
