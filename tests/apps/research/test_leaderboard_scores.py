"""Leaderboard score formulas on planted numbers: PostTrainBench cells, weights, the Lite reward."""

from __future__ import annotations

import pytest

from apps.flows.scores import (
    POSTTRAINBENCH_WEIGHTS,
    lite_gain,
    posttrainbench_cell,
    suite_aggregate,
)


@pytest.mark.parametrize(
    ("score", "base", "flagged", "substitute", "maximum"),
    [
        (0.62, 0.40, False, 0.62, 0.62),  # an improvement: both readings show it
        (0.31, 0.40, False, 0.31, 0.40),  # a regression stands in PostTrainBench's code, not under max
        (0.90, 0.40, True, 0.40, 0.40),  # flagged: base in both
        (None, 0.40, False, 0.40, 0.40),  # missing (ERR): base in both
        (0.55, None, False, 0.55, 0.55),  # no base: the run's score
    ],
)
def test_posttrainbench_cell_both_readings(score, base, flagged, substitute, maximum):
    sub = posttrainbench_cell(score=score, base=base, flagged=flagged, reading="substitute")
    mx = posttrainbench_cell(score=score, base=base, flagged=flagged, reading="max")
    assert (sub.value, mx.value) == (substitute, maximum)
    assert sub.reading == "substitute-when-flagged-or-missing"
    assert mx.reading == "max-with-base"
    assert sub.substituted == (score is None or flagged)


def test_an_unknown_reading_is_refused():
    with pytest.raises(ValueError, match="reading must be"):
        posttrainbench_cell(score=0.5, base=0.4, flagged=False, reading="mean")


def test_suite_aggregate_uses_the_published_weights_and_reports_the_rest_apart():
    cells = {"gsm8k": 0.5, "humaneval": 0.25, "bfcl": None, "minibench/arithmetic": 0.8, "minibench/qa": 0.6}
    agg = suite_aggregate(cells)
    assert agg.weighted == pytest.approx(0.0935882347031865 * 0.5 + 0.106148554819225 * 0.25)
    assert agg.weighted_benchmarks == ["gsm8k", "humaneval"]
    assert agg.missing == ["bfcl"]
    assert agg.unweighted_benchmarks == ["minibench/arithmetic", "minibench/qa"]
    assert agg.unweighted_mean == pytest.approx(0.7)
    assert agg.source.startswith("aisa-group/PostTrainBench@9082063a")


def test_the_published_weights_sum_to_one():
    # factors.json normalises the seven benchmarks; a mistyped copy would break this.
    assert sum(POSTTRAINBENCH_WEIGHTS.values()) == pytest.approx(1.0, abs=1e-9)
    assert len(POSTTRAINBENCH_WEIGHTS) == 7


def test_all_cells_at_one_give_the_sum_of_the_weights():
    agg = suite_aggregate(dict.fromkeys(POSTTRAINBENCH_WEIGHTS, 1.0))
    assert agg.weighted == pytest.approx(sum(POSTTRAINBENCH_WEIGHTS.values()))
    assert agg.unweighted_mean is None
    assert agg.missing == []


@pytest.mark.parametrize(
    ("score", "theta0", "reference", "gain"),
    [(0.6, 0.2, 1.0, 0.5), (0.1, 0.2, 1.0, 0.0), (1.2, 0.2, 1.0, 1.0), (0.6, 0.5, 0.5, None), (None, 0.2, 1.0, None)],
)
def test_lite_reward_on_planted_numbers(score, theta0, reference, gain):
    got, note = lite_gain(score, theta0, reference)
    assert got == (pytest.approx(gain) if gain is not None else None)
    assert bool(note) == (gain is None)
