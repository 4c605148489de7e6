"""Runs side by side: their configurations, best-so-far curves, final scores and paired differences.

The dashboard's comparison and ablation pages read these. Final scores come from one function,
``run_final_score``: the final-split evaluation of the checkpoint a run returned, with a
bootstrap CI over its per-sample results (EvaluationSample rows). Two runs are compared by a
paired bootstrap on the sample ids both final evaluations share (apps.experiments.comparisons,
the same resampling as the agents' ``compare_experiments`` tool).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db.models.functions import Coalesce

from apps.benchmarks.models import Split
from apps.experiments.choices import EvaluationStatus, ExperimentStatus, IntegrityStatus
from apps.experiments.comparisons import aligned_correctness, bootstrap_interval, paired_bootstrap
from apps.experiments.models import Evaluation, EvaluationSample
from apps.flows.scores import checkpoint_evaluation
from apps.research.models import Run
from apps.research.selectors import run_ablation

N_BOOT = 2000
CONFIDENCE = 0.95
SEED = 0


# --- final scores ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FinalScore:
    """A run's reported score: its returned checkpoint on the final split, with a bootstrap CI."""

    evaluation: Evaluation
    score: float
    ci_low: float
    ci_high: float
    n: int


def run_final_evaluation(run: Run) -> Evaluation | None:
    """The final-split evaluation of the checkpoint ``run`` returned: the one the run page reports."""
    return checkpoint_evaluation(run=run, checkpoint=run.result_checkpoint, split=Split.FINAL)


def run_final_score(run: Run) -> FinalScore | None:
    """The one lookup of a run's final score and CI that the comparison pages use.

    None when the run returned no checkpoint or it has no final evaluation with per-sample rows.
    """
    evaluation = run_final_evaluation(run)
    if evaluation is None:
        return None
    correct = np.array(list(EvaluationSample.objects.filter(evaluation=evaluation).values_list("correct", flat=True)))
    if len(correct) == 0:
        return None
    interval = bootstrap_interval(correct, n_boot=N_BOOT, confidence=CONFIDENCE, seed=SEED)
    return FinalScore(
        evaluation=evaluation, score=interval.mean, ci_low=interval.ci_low, ci_high=interval.ci_high, n=interval.n
    )


def runs_paired(first: Run, second: Run) -> dict[str, Any] | None:
    """Paired bootstrap of second − first on the final-split sample ids both runs' results share.

    None when either run has no final evaluation; ``n_common`` 0 when they share no sample id.
    """
    eval_a, eval_b = run_final_evaluation(first), run_final_evaluation(second)
    if eval_a is None or eval_b is None:
        return None
    _common, a, b, only_a, only_b = aligned_correctness(eval_a, eval_b)
    shared: dict[str, Any] = {"only_a": only_a, "only_b": only_b, "n_common": len(a)}
    if len(a) == 0:
        return shared
    result = paired_bootstrap(a, b, n_boot=N_BOOT, confidence=CONFIDENCE, seed=SEED)
    return {
        **shared,
        "mean_a": result.mean_a,
        "mean_b": result.mean_b,
        "difference": result.difference,
        "ci_low": result.ci_low,
        "ci_high": result.ci_high,
        "p_value": result.p_value,
        "confidence": CONFIDENCE,
        "n_boot": N_BOOT,
    }


# --- configurations --------------------------------------------------------------------------------


def run_config(run: Run) -> dict[str, Any]:
    """What a run was started with, flattened to dotted keys (``policy.heuristic.train_steps``)."""
    config: dict[str, Any] = {
        "benchmark": f"{run.benchmark.name}@{run.benchmark.version}",
        "base_checkpoint": run.base_checkpoint.handle,
        "agent_mode": run.agent_mode,
        "ablation": run_ablation(run),
        "budget.wall_seconds": run.budget_wall_seconds,
        "budget.accelerator_seconds": run.budget_accelerator_seconds,
        "budget.llm_tokens": run.budget_llm_tokens,
        "budget.reserved_final_seconds": run.reserved_final_seconds,
        "max_parallel_workers": run.max_parallel_workers,
    }
    _flatten("policy", run.policy or {}, config)
    for role, recorded in sorted((run.prompt_hashes or {}).items()):
        if isinstance(recorded, dict):
            config[f"prompt.{role}"] = recorded.get("version")
    return config


def _flatten(prefix: str, value: Any, into: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key in sorted(value):
            _flatten(f"{prefix}.{key}", value[key], into)
    else:
        into[prefix] = value


def config_diff(runs: list[Run]) -> list[dict[str, Any]]:
    """Every configuration key of ``runs``, each with its value per run and whether they differ."""
    configs = [run_config(run) for run in runs]
    keys = sorted({key for config in configs for key in config})
    missing = object()
    rows = []
    for key in keys:
        values = [config.get(key, missing) for config in configs]
        differs = any(v != values[0] for v in values[1:])
        rows.append({"key": key, "values": [None if v is missing else v for v in values], "differs": differs})
    return rows


# --- curves ----------------------------------------------------------------------------------------


def best_so_far(run: Run) -> list[dict[str, Any]]:
    """The run's best accepted feedback score over time: one point per improvement.

    x is seconds from the run's start to the feedback evaluation that set the new best (its job's
    end, or the row's creation for an evaluation without a job); only succeeded experiments whose
    integrity is accepted count, as in the runs list's best score.
    """
    origin = run.started_at or run.created_at
    rows = (
        Evaluation.objects.annotate(at=Coalesce("job__finished_at", "created_at"))
        .filter(
            run=run,
            split=Split.FEEDBACK,
            status=EvaluationStatus.OK,
            experiment__status=ExperimentStatus.SUCCEEDED,
            experiment__integrity_status=IntegrityStatus.ACCEPTED,
        )
        .order_by("at", "pk")
        .values_list("at", "score", "experiment__handle")
    )
    points: list[dict[str, Any]] = []
    for created_at, score, handle in rows:
        if score is None or (points and score <= points[-1]["best"]):
            continue
        points.append({"seconds": max(0.0, (created_at - origin).total_seconds()), "best": score, "experiment": handle})
    return points


# --- the ablation view -----------------------------------------------------------------------------


def ablation_groups(runs: list[Run]) -> list[dict[str, Any]]:
    """Runs grouped as the paper's ablation: per benchmark and budget, one arm per ablation switch set.

    Each arm lists its runs (the seeds) with their final scores, the arm's mean and standard
    deviation over the runs that have one, and a bootstrap CI of the mean over those runs. Each
    group pairs full with every other arm on the seeds both ran (``paired``: the paired bootstrap
    of the per-seed differences, full minus the arm; a seed run twice counts its latest run).
    """
    groups: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        key = (
            f"{run.benchmark.name}@{run.benchmark.version}",
            run.budget_wall_seconds,
            run.budget_accelerator_seconds,
            run.budget_llm_tokens,
        )
        final = run_final_score(run)
        groups.setdefault(key, {}).setdefault(run_ablation(run), []).append(
            {"run": run, "seed": (run.policy or {}).get("seed", 0), "final": final}
        )
    out = []
    for (benchmark, wall, accelerator, tokens), arms in sorted(groups.items(), key=lambda item: item[0]):
        out.append(
            {
                "benchmark": benchmark,
                "budget": {"wall_seconds": wall, "accelerator_seconds": accelerator, "llm_tokens": tokens},
                "arms": [_arm(name, arms[name]) for name in sorted(arms, key=_arm_order)],
                "paired": _paired_arms(arms),
            }
        )
    return out


def _by_seed(members: list[dict[str, Any]]) -> dict[int, float]:
    latest: dict[int, tuple[Any, float]] = {}
    for m in members:
        if m["final"] is None:
            continue
        at = (m["run"].created_at, m["run"].pk)
        if m["seed"] not in latest or at > latest[m["seed"]][0]:
            latest[m["seed"]] = (at, m["final"].score)
    return {seed: score for seed, (_, score) in latest.items()}


def _paired_arms(arms: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    if "full" not in arms:
        return []
    full = _by_seed(arms["full"])
    out = []
    for name in sorted(arms, key=_arm_order):
        if name == "full":
            continue
        other = _by_seed(arms[name])
        seeds = sorted(set(full) & set(other))
        row: dict[str, Any] = {"arm": name, "seeds": seeds, "difference": None}
        if seeds:
            result = paired_bootstrap(np.array([other[s] for s in seeds]), np.array([full[s] for s in seeds]),
                                      n_boot=N_BOOT, confidence=CONFIDENCE, seed=SEED)  # fmt: skip
            # One seed is a point, not a distribution: its bootstrap "CI" is the point itself.
            many = len(seeds) > 1
            row.update(difference=result.difference, ci_low=result.ci_low if many else None,
                       ci_high=result.ci_high if many else None, p_value=result.p_value if many else None)  # fmt: skip
        out.append(row)
    return out


def _arm_order(name: str) -> tuple[int, str]:
    return (0 if name == "full" else 1, name)


def _arm(name: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    scores = [m["final"].score for m in members if m["final"] is not None]
    mean = sum(scores) / len(scores) if scores else None
    sd = (
        math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1))
        if mean is not None and len(scores) > 1
        else None
    )
    # A CI over one seed would be drawn as [x, x]: there is none to draw.
    interval = (
        bootstrap_interval(np.array(scores), n_boot=N_BOOT, confidence=CONFIDENCE, seed=SEED)
        if len(scores) > 1
        else None
    )
    low, high = (interval.ci_low, interval.ci_high) if interval else (None, None)
    return {"name": name, "runs": members, "n_scored": len(scores), "mean": mean, "sd": sd, "ci_low": low,
            "ci_high": high}  # fmt: skip
