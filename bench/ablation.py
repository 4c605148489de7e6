"""The paper's ablation on the minibench hard profile (issue 19): full vs --serial-workers vs --no-reviewer.

    cd bench && REDIS_URL=redis://127.0.0.1:6379/N ../.venv/bin/python ablation.py \\
        --hard <built hard profile> --seeds 0 1 2 3 4 [--wall-seconds 1200] [--concurrent 3]
    ../.venv/bin/python ablation.py --analyze <suite or run uuid> ...   (finished runs, any order)

The runs are one agent suite (apps.dojo.suites, agents ``ABLATION_AGENTS``: heuristic,
heuristic-serial-workers, heuristic-no-reviewer; one cell per seed), the same suite the comparison
page's "Run the ablation" button creates: each (configuration, seed) is one real heuristic run on
the real stack (daphne + Celery gpu / agents / default workers, a dedicated PostgreSQL database,
the Redis db of REDIS_URL, which is flushed), every configuration at the same budget (the wall
clock binds; the accelerator budget is set above what the training slots can spend), at most
``--concurrent`` at once (the suite's clock). From the records it reports, per arm (the arms and
the paired comparison over seeds are the ablation page's, ``apps.flows.compare.ablation_groups``):

- **final-split score** of the returned checkpoint with its per-sample bootstrap CI
  (``apps.flows.compare.run_final_score``), the arm's mean over seeds with a bootstrap CI over
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from apps.benchmarks.minibench.hard.build import SUGGESTED_BUDGET  # noqa: E402 - after the path
from apps.ml.hparams import LR_SCHEDULERS  # noqa: E402 - after the path

N_BOOT = 2000
SLOTS = 2  # training jobs at once on the stack (the gpu worker's concurrency), shared by concurrent runs
# The suite's agent configurations and the ablation arm each one is (apps.research.selectors.run_ablation).
ARM_OF = {"heuristic": "full", "heuristic-serial-workers": "serial-workers", "heuristic-no-reviewer": "no-reviewer",
          "heuristic-uct": "full · uct"}  # fmt: skip


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
    from apps.flows.compare import best_so_far, run_final_score
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
        # Training time the run got (final evaluation excluded): the slots' share between the arms.
        "accelerator_seconds": round(run.used_accelerator_seconds, 1),
    }  # fmt: skip


def summarize(runs: list[Any]) -> dict[str, Any]:
    """Arms, their seed-level CIs and the paired comparisons of full against each ablation."""
    from apps.flows.compare import ablation_groups, runs_paired
    from apps.research.selectors import run_ablation

    rows = [analyze(run) for run in runs]
    groups = ablation_groups(runs)
    if len(groups) != 1:
        raise SystemExit(f"the runs fall in {len(groups)} benchmark/budget groups; an ablation compares one")
    by_arm: dict[str, dict[int, tuple[Any, dict[str, Any]]]] = {}
    for run, row in zip(runs, rows, strict=True):
        by_arm.setdefault(run_ablation(run), {})[row["seed"]] = (run, row)
    arms = {}
    for arm in groups[0]["arms"]:
        seeds = by_arm[arm["name"]]
        rates = [r["iterations"]["rate"] for _, r in seeds.values() if r["iterations"]["rate"] is not None]
        arms[arm["name"]] = {
            "seeds": sorted(seeds),
            "n_scored": arm["n_scored"],
            "mean": None if arm["mean"] is None else round(arm["mean"], 3),
            "ci_over_seeds": None if arm["mean"] is None else [round(arm["ci_low"], 3), round(arm["ci_high"], 3)],
            "effective_iteration_rate": round(sum(rates) / len(rates), 3) if rates else None,
            "reviews": sum(r["reviews"]["reports"] for _, r in seeds.values()),
            "reviews_changed_decision": sum(r["reviews"]["changed"] for _, r in seeds.values()),
        }
    paired = {}
    full = by_arm.get("full", {})
    for pair in groups[0]["paired"]:
        arm = pair["arm"]
        per_seed = {s: runs_paired(by_arm[arm][s][0], full[s][0]) for s in sorted(set(full) & set(by_arm[arm]))}
        paired[f"full - {arm}"] = {
            "seeds": pair["seeds"],
            "over_seeds": None if pair["difference"] is None else {"difference": round(pair["difference"], 3),
                                                                   "ci": [round(pair["ci_low"], 3),
                                                                          round(pair["ci_high"], 3)],
                                                                   "p": round(pair["p_value"], 3)},  # fmt: skip
            "per_seed_samples": {s: None if p is None or "difference" not in p else
                                 {"difference": round(p["difference"], 3), "ci": [round(p["ci_low"], 3),
                                  round(p["ci_high"], 3)], "n": p["n_common"]} for s, p in per_seed.items()},
        }  # fmt: skip
    return {"runs": rows, "arms": arms, "paired": paired}


def _start_stack(base: Path, hard: Path) -> Any:
    import socket

    from django.conf import settings

    from apps.flows.management.commands.demo import Stack

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="rsiweb.settings.base", PYTHONPATH=str(Path(__file__).parents[1]),
               RSI_ARTIFACT_ROOT=settings.ARTIFACT_ROOT, RSI_SEALED_ROOT=settings.SEALED_ROOT,
               RSI_WORKSPACE_ROOT=settings.WORKSPACE_ROOT, RSI_MINIBENCH_ROOT=str(hard),
               RSI_AGENT_POLL_SECONDS="1", RSI_AGENT_WAIT_SECONDS="20", RSI_RUN_SUPERVISE_SECONDS="1",
               RSI_FINAL_GRACE_SECONDS="60", OMP_NUM_THREADS="1", RSI_TOKEN_RATE="")  # fmt: skip
    stack = Stack(env=env, log_dir=base / "logs", port=port, gpu_slots=SLOTS, agent_threads=4)
    settings.RSI_API_URL = stack.url
    stack.start()
    stack.wait_ready()
    return stack


def launch(args: argparse.Namespace) -> Any:
    """The ablation suite: ABLATION_AGENTS x the given seeds on the hard profile, every cell's budget equal."""
    from apps.dojo.agents import ABLATION_AGENTS, FULL_UNDER
    from apps.dojo.suites import suite_create, suite_launch

    agents = [a for a in ABLATION_AGENTS if ARM_OF[a] in args.configs]
    agents += [FULL_UNDER[p] for p in args.search_policies if p in FULL_UNDER]
    budget = {"wall_seconds": args.wall_seconds, "accelerator_seconds": args.accelerator_seconds,
              "parallel": args.parallel, "max_workers": args.max_workers, "screen_steps": args.screen_steps,
              "train_steps": args.train_steps, "batch_size": args.batch_size, "learning_rate": args.learning_rate,
              "lr_scheduler_type": args.lr_scheduler}  # fmt: skip
    suite = suite_create(name="bench: ablation on minibench-hard", agents=agents, tasks=["minibench-hard/arithmetic"],
                         base_models=["minibench-hard/theta0"], budget=budget, seeds=args.seeds,
                         max_concurrent=args.concurrent, actor="bench")  # fmt: skip
    return suite_launch(suite=suite, actor="bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--analyze", nargs="*", help="only analyze these finished runs (uuids)")
    parser.add_argument("--hard", type=Path, help="a built hard profile (python -m apps.benchmarks.minibench.hard)")
    parser.add_argument("--configs", nargs="*", default=["full", "serial-workers", "no-reviewer"],
                        choices=list(ARM_OF.values()))  # fmt: skip
    parser.add_argument("--search-policies", nargs="*", default=["greedy", "uct"], choices=["greedy", "uct"],
                        help="the full arm under each of these search policies (greedy: the arm full)")  # fmt: skip
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2, 3, 4])
    # The binding budget is the wall clock, equal for every arm: within it a serial line of work
    # tries fewer directions than parallel Workers (the profile's budget trap). The accelerator
    # budget defaults to more than the stack's training slots can spend in that time, so it never
    # binds first (on a CPU host a job's accelerator seconds are its wall seconds).
    # The defaults are the hard profile's SUGGESTED_BUDGET (issue 32 item 4): a second round fits in
    # the wall clock with the four arms of a seed side by side on a 2-core machine, and trainings at a
    # constant rate pass the task's transition in it (bench/hard_transition.py).
    parser.add_argument("--wall-seconds", type=int, default=SUGGESTED_BUDGET["wall_seconds"])
    parser.add_argument(
        "--accelerator-seconds",
        type=int,
        default=None,
        help=f"default: {SLOTS} training slots x the wall clock x 2 (not binding)",
    )
    parser.add_argument("--parallel", type=int, default=SUGGESTED_BUDGET["parallel"],
                        help="Workers at once in the non-serial arms")  # fmt: skip
    parser.add_argument("--max-workers", type=int, default=SUGGESTED_BUDGET["max_workers"])
    parser.add_argument("--screen-steps", type=int, default=SUGGESTED_BUDGET["screen_steps"])
    parser.add_argument("--train-steps", type=int, default=SUGGESTED_BUDGET["train_steps"])
    parser.add_argument("--batch-size", type=int, default=SUGGESTED_BUDGET["batch_size"])
    parser.add_argument("--learning-rate", type=float, default=SUGGESTED_BUDGET["learning_rate"])
    parser.add_argument("--lr-scheduler", default=SUGGESTED_BUDGET["lr_scheduler_type"],
                        choices=LR_SCHEDULERS)  # fmt: skip
    parser.add_argument(
        "--concurrent",
        type=int,
        default=4,
        help="runs at once (the suite's max_concurrent; 4: the arms of a seed side by side)",
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/rsiweb-bench-ablation/result.json"))
    args = parser.parse_args()
    if args.accelerator_seconds is None:
        args.accelerator_seconds = SLOTS * args.wall_seconds * 2
    if args.analyze:
        django_on_bench_db("rsiweb_bench_ablation", fresh=False)
        from apps.dojo.models import AgentSuite
        from apps.research.models import Run

        runs: list[Any] = []
        for uuid in args.analyze:  # a run, or a suite standing for all its runs
            suite = AgentSuite.objects.filter(uuid=uuid).first()
            runs += [c.run for c in suite.cells.order_by("position")] if suite else [Run.objects.get(uuid=uuid)]
        print(json.dumps(summarize(runs), indent=2, default=str))
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
    from apps.research.choices import RUN_TERMINAL_STATES
    from apps.research.models import Run

    minibench_install(root=args.hard)
    stack = _start_stack(base, args.hard)
    started = time.monotonic()
    try:
        suite = launch(args)
        print(f"suite {suite.uuid}: {suite.cells.count()} runs", flush=True)
        reported: set[int] = set()
        cells = len(args.seeds) * (len(args.configs) + len(args.search_policies))
        deadline = time.monotonic() + (args.wall_seconds + 900) * cells
        while True:
            suite.refresh_from_db()
            for cell in suite.cells.select_related("run").order_by("position"):
                if cell.run_id not in reported and cell.run.status in RUN_TERMINAL_STATES:
                    reported.add(cell.run_id)
                    print(json.dumps(analyze(Run.objects.get(pk=cell.run_id)), default=str), flush=True)
            if suite.status == "finished":
                break
            if time.monotonic() > deadline:
                sys.exit(f"suite {suite.uuid} did not finish in time")
            time.sleep(5)
    finally:
        stack.stop()
    runs = [c.run for c in suite.cells.select_related("run").order_by("position")]
    result = summarize(runs)
    result.update(suite=str(suite.uuid), profile={k: manifest.get(k) for k in ("source_digest", "size", "seed")},
                  arguments=vars(args) | {"hard": str(args.hard), "out": str(args.out)},
                  measured_seconds=round(time.monotonic() - started, 1), load_average=os.getloadavg())  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: result[k] for k in ("arms", "paired")}, indent=2, default=str))
    print(f"written to {args.out}; the runs are on the dashboard's /runs/ablation/?suite={suite.uuid} page")


if __name__ == "__main__":
    main()
