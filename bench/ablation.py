"""The paper's ablation on the minibench hard profile (issue 19): full vs --serial-workers vs --no-reviewer.

    cd bench && REDIS_URL=redis://127.0.0.1:6379/N ../.venv/bin/python ablation.py \\
        --hard <built hard profile> --seeds 0 1 2 3 4 [--accelerator-seconds 900] [--concurrent 1]
    ../.venv/bin/python ablation.py --analyze <run uuid> ...        (finished runs, any order)

Each (configuration, seed) is one real heuristic run on the real stack (daphne + Celery gpu /
agents / default workers, a dedicated PostgreSQL database, the Redis db of REDIS_URL, which is
flushed), every configuration at the same budget. From the records it reports, per arm:

- **final-split score** of the returned checkpoint with its per-sample bootstrap CI
  (``apps.research.compare.run_final_score``), the arm's mean over seeds with a bootstrap CI over
  seeds (``apps.experiments.comparisons.bootstrap_interval``);
- a **paired comparison** of full against each ablation: per seed, the paired per-sample bootstrap
  on the final split (``runs_paired``), and over seeds, the paired bootstrap of the per-seed
  differences (``paired_bootstrap``);
- **best-so-far curves** (``best_so_far``: accepted feedback score over run time);
- the **effective-iteration rate**: succeeded, accepted training experiments / all submissions
  (refused ones included);
- how often a **reviewer report changed the next decision**: reports after which the Main Agent's
  decisions were anything but "continue from the best" (what it does without a reviewer).

The runs are ordinary runs: the dashboard's ablation page (``/runs/ablation/``) groups them, with
the same functions, one click from the comparison page.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from _setup import django_on_bench_db

CONFIGS: dict[str, dict[str, Any]] = {
    "full": {"reviewer": True, "serial_workers": False},
    "serial-workers": {"reviewer": True, "serial_workers": True},
    "no-reviewer": {"reviewer": False, "serial_workers": False},
}
N_BOOT = 2000


def _effective(run: Any) -> dict[str, Any]:
    from apps.experiments.models import Experiment

    rows = list(Experiment.objects.filter(run=run).values_list("kind", "status", "integrity_status"))
    total = len(rows)
    effective = sum(1 for kind, status, integrity in rows
                    if kind == "train_eval" and status == "succeeded" and integrity == "accepted")  # fmt: skip
    return {"submissions": total, "effective": effective, "rate": round(effective / total, 3) if total else None}


def _reviews_changed(run: Any) -> dict[str, Any]:
    """Per reviewer report: did the decisions it triggered differ from 'continue from the best'?"""
    from apps.research.models import Decision
    from apps.reviews.models import ReviewReport

    reports = list(
        ReviewReport.objects.filter(run=run).order_by("created_at", "pk").values_list("created_at", flat=True)
    )
    decisions = list(Decision.objects.filter(run=run, trigger="review_report").order_by("created_at", "pk")
                     .values_list("created_at", "kind"))  # fmt: skip
    changed = 0
    for i, at in enumerate(reports):
        until = reports[i + 1] if i + 1 < len(reports) else None
        kinds = {k for t, k in decisions if t >= at and (until is None or t < until)}
        if kinds - {"continue"}:
            changed += 1
    return {"reports": len(reports), "changed": changed}


def analyze(run: Any) -> dict[str, Any]:
    from apps.research.compare import best_so_far, run_final_score
    from apps.research.selectors import run_ablation

    final = run_final_score(run)
    return {
        "run": str(run.uuid),
        "arm": run_ablation(run),
        "seed": (run.policy or {}).get("seed", 0),
        "status": run.status,
        "final": None if final is None else {"score": round(final.score, 3), "ci_low": round(final.ci_low, 3),
                                             "ci_high": round(final.ci_high, 3), "n": final.n},  # fmt: skip
        "best_so_far": [{"seconds": round(p["seconds"], 1), "best": p["best"], "experiment": p["experiment"]}
                        for p in best_so_far(run)],  # fmt: skip
        "iterations": _effective(run),
        "reviews": _reviews_changed(run),
        "wall_seconds": round(((run.finished_at or run.updated_at) - run.started_at).total_seconds(), 1)
        if run.started_at else None,
    }  # fmt: skip


def summarize(runs: list[Any]) -> dict[str, Any]:
    """Arms, their seed-level CIs and the paired comparisons of full against each ablation."""
    import numpy as np

    from apps.experiments.comparisons import bootstrap_interval, paired_bootstrap
    from apps.research.compare import runs_paired
    from apps.research.selectors import run_ablation

    rows = [analyze(run) for run in runs]
    by_arm: dict[str, dict[int, tuple[Any, dict[str, Any]]]] = {}
    for run, row in zip(runs, rows, strict=True):
        by_arm.setdefault(run_ablation(run), {})[row["seed"]] = (run, row)
    arms = {}
    for arm, seeds in by_arm.items():
        scores = [r["final"]["score"] for _, r in seeds.values() if r["final"]]
        rates = [r["iterations"]["rate"] for _, r in seeds.values() if r["iterations"]["rate"] is not None]
        interval = bootstrap_interval(np.array(scores), n_boot=N_BOOT, confidence=0.95, seed=0) if scores else None
        arms[arm] = {
            "seeds": sorted(seeds),
            "n_scored": len(scores),
            "mean": None if interval is None else round(interval.mean, 3),
            "ci_over_seeds": None if interval is None else [round(interval.ci_low, 3), round(interval.ci_high, 3)],
            "effective_iteration_rate": round(sum(rates) / len(rates), 3) if rates else None,
            "reviews": sum(r["reviews"]["reports"] for _, r in seeds.values()),
            "reviews_changed_decision": sum(r["reviews"]["changed"] for _, r in seeds.values()),
        }
    paired = {}
    full = by_arm.get("full", {})
    for arm, seeds in by_arm.items():
        if arm == "full":
            continue
        common = sorted(set(full) & set(seeds))
        per_seed = {s: runs_paired(seeds[s][0], full[s][0]) for s in common}
        a = np.array([seeds[s][1]["final"]["score"] for s in common if seeds[s][1]["final"] and full[s][1]["final"]])
        b = np.array([full[s][1]["final"]["score"] for s in common if seeds[s][1]["final"] and full[s][1]["final"]])
        over = paired_bootstrap(a, b, n_boot=N_BOOT, confidence=0.95, seed=0) if len(a) else None
        paired[f"full - {arm}"] = {
            "seeds": common,
            "over_seeds": None if over is None else {"difference": round(over.difference, 3),
                                                     "ci": [round(over.ci_low, 3), round(over.ci_high, 3)],
                                                     "p": round(over.p_value, 3)},  # fmt: skip
            "per_seed_samples": {s: None if p is None or "difference" not in p else
                                 {"difference": round(p["difference"], 3), "ci": [round(p["ci_low"], 3),
                                  round(p["ci_high"], 3)], "n": p["n_common"]} for s, p in per_seed.items()},
        }  # fmt: skip
    return {"runs": rows, "arms": arms, "paired": paired}


def _start_stack(base: Path, hard: Path) -> Any:
    import socket

    from django.conf import settings

    from apps.core.management.commands.demo import Stack

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="rsiweb.settings.base", PYTHONPATH=str(Path(__file__).parents[1]),
               RSI_ARTIFACT_ROOT=settings.ARTIFACT_ROOT, RSI_SEALED_ROOT=settings.SEALED_ROOT,
               RSI_WORKSPACE_ROOT=settings.WORKSPACE_ROOT, RSI_MINIBENCH_ROOT=str(hard),
               RSI_AGENT_POLL_SECONDS="1", RSI_AGENT_WAIT_SECONDS="20", RSI_RUN_SUPERVISE_SECONDS="1",
               RSI_FINAL_GRACE_SECONDS="60", OMP_NUM_THREADS="1", RSI_TOKEN_RATE="")  # fmt: skip
    stack = Stack(env=env, log_dir=base / "logs", port=port, gpu_slots=2, agent_threads=4)
    settings.RSI_API_URL = stack.url
    stack.start()
    stack.wait_ready()
    return stack


def launch(config: str, seed: int, args: argparse.Namespace) -> Any:
    from apps.experiments.models import Checkpoint
    from apps.research.services import run_launch

    return run_launch(benchmark="minibench-hard/arithmetic", policy="heuristic", name=f"ablation: {config} seed {seed}",
                      base_checkpoint=Checkpoint.objects.get(handle="minibench-hard/theta0"),
                      wall_seconds=args.wall_seconds, accelerator_seconds=args.accelerator_seconds,
                      parallel=args.parallel, max_workers=args.max_workers, screen_steps=args.screen_steps,
                      train_steps=args.train_steps, batch_size=args.batch_size, seed=seed, actor="bench",
                      **CONFIGS[config])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--analyze", nargs="*", help="only analyze these finished runs (uuids)")
    parser.add_argument("--hard", type=Path, help="a built hard profile (python -m apps.benchmarks.minibench.hard)")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--accelerator-seconds", type=int, default=900)
    parser.add_argument("--wall-seconds", type=int, default=3600)
    parser.add_argument("--parallel", type=int, default=3, help="Workers at once in the non-serial arms")
    parser.add_argument("--max-workers", type=int, default=4)
    parser.add_argument("--screen-steps", type=int, default=60)
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--concurrent", type=int, default=1, help="runs at once on the stack")
    parser.add_argument("--out", type=Path, default=Path("/tmp/rsiweb-bench-ablation/result.json"))
    args = parser.parse_args()
    if args.analyze:
        django_on_bench_db("rsiweb_bench_ablation", fresh=False)
        from apps.research.models import Run

        print(json.dumps(summarize([Run.objects.get(uuid=u) for u in args.analyze]), indent=2, default=str))
        return
    if not args.hard or not (args.hard / "manifest.json").exists():
        sys.exit("--hard must name a built hard profile (python -m apps.benchmarks.minibench.hard DIR --size ...)")
    manifest = json.loads((args.hard / "manifest.json").read_text())
    base = Path(os.environ.get("BENCH_DIR", "/tmp/rsiweb-bench-ablation"))
    os.environ.update(RSI_ARTIFACT_ROOT=str(base / "artifacts"), RSI_SEALED_ROOT=str(base / "sealed"),
                      RSI_WORKSPACE_ROOT=str(base / "workspaces"), RSI_MINIBENCH_ROOT=str(args.hard),
                      RSI_DATA_DIR=str(base / "data"))  # fmt: skip
    django_on_bench_db("rsiweb_bench_ablation")
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    from apps.benchmarks.services import minibench_install
    from apps.research.management.commands.start_run import wait_for_result
    from apps.research.models import Run

    minibench_install(root=args.hard)
    stack = _start_stack(base, args.hard)
    started = time.monotonic()
    order = [(seed, config) for seed in args.seeds for config in args.configs]
    runs: list[Any] = []
    try:
        while order:
            batch, order = order[: args.concurrent], order[args.concurrent :]
            launched = [launch(config, seed, args) for seed, config in batch]
            for run in launched:
                runs.append(wait_for_result(run, poll=2.0, timeout=args.wall_seconds + 900))
                print(json.dumps(analyze(Run.objects.get(pk=run.pk)), default=str), flush=True)
    finally:
        stack.stop()
    result = summarize([Run.objects.get(pk=r.pk) for r in runs])
    result.update(profile={k: manifest.get(k) for k in ("source_digest", "size", "seed")},
                  arguments=vars(args) | {"hard": str(args.hard), "out": str(args.out)},
                  measured_seconds=round(time.monotonic() - started, 1), load_average=os.getloadavg())  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: result[k] for k in ("arms", "paired")}, indent=2, default=str))
    print(f"written to {args.out}; the runs are on the dashboard's /runs/ablation/ page")


if __name__ == "__main__":
    main()
