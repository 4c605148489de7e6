"""The final evaluation's score over seeds: the mean over the seeds that succeeded, with a bootstrap CI.

`apps.ml.inference.evaluate_seeds` runs one evaluation per run seed (5 for sampled decoding, 1
for greedy; `apps.ml.seeds`); a seed whose generation failed through the whole retry cascade is
reported, not averaged. The score is the mean of the succeeded seeds' scores; the interval
resamples sample ids over each sample's mean correctness across those seeds (the same number:
with every seed covering every sample, the mean of per-sample means is the mean of seed scores),
so it measures the uncertainty from which items were drawn, as the paired comparisons do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from apps.core.errors import ApplicationError
from apps.experiments.comparisons import bootstrap_interval

N_BOOT = 2000
CONFIDENCE = 0.95
BOOT_SEED = 0


def seeds_aggregate(
    results: list[dict[str, Any]], *, n_boot: int = N_BOOT, confidence: float = CONFIDENCE
) -> dict[str, Any]:
    """Summary of `evaluate_seeds` results: per-seed scores, the mean over succeeded seeds, its CI.

    Raises when no seed succeeded (nothing to report) or when the succeeded seeds scored different
    sample ids (their mean would compare unlike things).
    """
    succeeded = [r for r in results if r["status"] == "ok"]
    failed = [{"seed": r["seed"], "error": r.get("error", "")} for r in results if r["status"] != "ok"]
    if not succeeded:
        raise ApplicationError(
            "all_seeds_failed",
            f"No seed of the final evaluation succeeded ({len(results)} tried): "
            + "; ".join(f"seed {f['seed']}: {f['error'][:200]}" for f in failed[:3]),
            status=409,
        )
    ids = [str(row["id"]) for row in succeeded[0]["rows"]]
    for r in succeeded[1:]:
        if [str(row["id"]) for row in r["rows"]] != ids:
            raise ApplicationError(
                "seed_samples_differ", f"seed {r['seed']} scored other sample ids than seed {succeeded[0]['seed']}"
            )
    if not ids:
        raise ApplicationError("no_samples", "The final evaluation scored no samples.", status=409)
    matrix = np.array([[1.0 if row["correct"] else 0.0 for row in r["rows"]] for r in succeeded])
    per_seed = [{"seed": r["seed"], "score": float(matrix[k].mean())} for k, r in enumerate(succeeded)]
    interval = bootstrap_interval(matrix.mean(axis=0), n_boot=n_boot, confidence=confidence, seed=BOOT_SEED)
    return {
        "seeds": [r["seed"] for r in results],
        "succeeded": [r["seed"] for r in succeeded],
        "failed": failed,
        "per_seed": per_seed,
        "mean": float(matrix.mean()),
        "ci_low": interval.ci_low,
        "ci_high": interval.ci_high,
        "confidence": confidence,
        "n_boot": n_boot,
        "sample_count": len(ids),
    }
