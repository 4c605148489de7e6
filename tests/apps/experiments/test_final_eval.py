"""The final evaluation's mean over succeeded seeds and its bootstrap interval, on planted results."""

from __future__ import annotations

import pytest

from apps.core.errors import ApplicationError
from apps.experiments.final_eval import seeds_aggregate


def _rows(correct: list[bool]) -> list[dict[str, object]]:
    return [{"id": f"s{i}", "output": "", "correct": c} for i, c in enumerate(correct)]


def test_mean_is_over_succeeded_seeds_and_failed_seeds_are_reported() -> None:
    results = [
        {"seed": 0, "status": "ok", "rows": _rows([True, True, False, False])},  # 0.5
        {"seed": 1, "status": "failed", "error": "every retry failed"},
        {"seed": 2, "status": "ok", "rows": _rows([True, True, True, False])},  # 0.75
    ]
    summary = seeds_aggregate(results, n_boot=500)
    assert summary["seeds"] == [0, 1, 2]
    assert summary["succeeded"] == [0, 2]
    assert summary["failed"] == [{"seed": 1, "error": "every retry failed"}]
    assert summary["per_seed"] == [{"seed": 0, "score": 0.5}, {"seed": 2, "score": 0.75}]
    assert summary["mean"] == pytest.approx(0.625)
    assert summary["ci_low"] <= 0.625 <= summary["ci_high"]
    assert 0.0 <= summary["ci_low"] < summary["ci_high"] <= 1.0
    assert summary["sample_count"] == 4


def test_all_failed_or_mismatched_seeds_are_refused() -> None:
    with pytest.raises(ApplicationError, match="No seed of the final evaluation succeeded"):
        seeds_aggregate([{"seed": 0, "status": "failed", "error": "down"}])
    mismatched = [
        {"seed": 0, "status": "ok", "rows": _rows([True])},
        {"seed": 1, "status": "ok", "rows": [{"id": "other", "output": "", "correct": True}]},
    ]
    with pytest.raises(ApplicationError, match="other sample ids"):
        seeds_aggregate(mismatched)
