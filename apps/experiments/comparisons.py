"""Paired comparisons of evaluations on shared sample ids, and bootstrap intervals of a score.

The ExpOS ``compare_experiments`` tool (feedback split, scoped per caller) and the dashboard's
run comparison (final split, apps.flows.compare) both resample here, so an agent and a
person comparing the same two evaluations get the same numbers for the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from apps.core.errors import ApplicationError
from apps.experiments.models import Evaluation, EvaluationSample

# Bounded memory: at most ~2M resampled indices at a time.
_CHUNK_INDICES = 2_000_000


@dataclass(frozen=True)
class PairedComparison:
    n_common: int
    mean_a: float
    mean_b: float
    difference: float  # mean_b - mean_a over the common samples
    ci_low: float
    ci_high: float
    p_value: float


def paired_bootstrap(a: np.ndarray, b: np.ndarray, *, n_boot: int, confidence: float, seed: int) -> PairedComparison:
    """Percentile bootstrap CI of mean(b) - mean(a) over aligned samples (resampling sample ids).

    Resampling pairs, not each side alone, keeps the correlation between two models on the same
    item, which is what makes a paired comparison tighter than two independent scores.
    """
    n = len(a)
    if n == 0:
        raise ApplicationError("no_common_samples", "The two evaluations share no sample ids.", status=409)
    diffs = b.astype(np.float64) - a.astype(np.float64)
    means = _resampled_means(diffs, n_boot, seed)
    low, high = _quantiles(means, confidence)
    p_value = min(1.0, 2 * min(float((means <= 0).mean()), float((means >= 0).mean())))
    return PairedComparison(
        n_common=n,
        mean_a=float(a.mean()),
        mean_b=float(b.mean()),
        difference=float(diffs.mean()),
        ci_low=low,
        ci_high=high,
        p_value=p_value,
    )


def aligned_correctness(first: Evaluation, second: Evaluation) -> tuple[list[str], np.ndarray, np.ndarray, int, int]:
    """Per-sample correctness of two evaluations aligned by stable sample id (server-side only)."""
    left = dict(EvaluationSample.objects.filter(evaluation=first).values_list("sample_id", "correct"))
    right = dict(EvaluationSample.objects.filter(evaluation=second).values_list("sample_id", "correct"))
    common = sorted(left.keys() & right.keys())
    a = np.array([left[s] for s in common], dtype=bool)
    b = np.array([right[s] for s in common], dtype=bool)
    return common, a, b, len(left.keys() - right.keys()), len(right.keys() - left.keys())


@dataclass(frozen=True)
class ScoreInterval:
    n: int
    mean: float
    ci_low: float
    ci_high: float


def bootstrap_interval(values: np.ndarray, *, n_boot: int, confidence: float, seed: int) -> ScoreInterval:
    """Percentile bootstrap CI of mean(values), resampling samples."""
    n = len(values)
    if n == 0:
        raise ApplicationError("no_samples", "The evaluation has no per-sample results.", status=409)
    low, high = _quantiles(_resampled_means(values.astype(np.float64), n_boot, seed), confidence)
    return ScoreInterval(n=n, mean=float(values.mean()), ci_low=low, ci_high=high)


def _resampled_means(values: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    n = len(values)
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    chunk = max(1, _CHUNK_INDICES // n)
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        means[start : start + size] = values[rng.integers(0, n, size=(size, n))].mean(axis=1)
    return means


def _quantiles(means: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)
