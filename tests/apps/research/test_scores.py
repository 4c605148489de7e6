"""The run-scores service (apps.flows.scores) on real rows: a run ended through the real services.

The dashboard's world run is stopped, its final evaluation jobs are claimed and succeed with
per-sample rows (tests/apps/dashboard/world.py ``finish_world``), and ``run_finish`` records the
result; the service then reads what a finished run left behind.
"""

from __future__ import annotations

import numpy as np
import pytest

from apps.flows.scores import bootstrap_ci, lite_gain, run_scores
from apps.integrity.choices import Adjudication
from apps.integrity.services import finding_adjudicate
from tests.apps.dashboard.world import build_world, finish_world, make_people

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(db):
    return build_world(people=make_people())


def _clear_violation(world) -> None:
    """A reviewer re-adjudicates exp_0002's test-set finding as allowed: the run has no violation left."""
    finding = world.findings[("exp_0002", "test_set_access")]
    finding_adjudicate(finding=finding, adjudication=Adjudication.ALLOWED, actor="reviewer_0001",
                       rationale="the overlap was a false match on formatting")  # fmt: skip


def test_finished_run_reports_raw_score_with_ci_theta0_reference_and_gain(world):
    _clear_violation(world)
    finish_world(world)

    scores = run_scores(run=world.run)

    # Cleared, exp_0002 (0.61 on feedback, its own θ_out trained from exp_0001's) is the best accepted.
    assert scores.returned_checkpoint == world.exp["e2"].output_checkpoint.handle
    assert scores.returned_experiment == "exp_0002"
    assert (scores.raw.score, scores.theta0.score, scores.reference.score) == (0.55, 0.25, 0.85)
    assert scores.raw.n == 20
    assert scores.raw.low < 0.55 < scores.raw.high
    assert scores.raw.low >= 0.0
    assert scores.raw.high <= 1.0
    # θ0 and the reference come from the same split's final evaluation, not the world's older rows.
    assert scores.theta0.evaluation != scores.reference.evaluation
    assert scores.gain == pytest.approx(0.5)
    assert scores.gain_note == ""
    assert scores.violation is False
    assert scores.blocked_attempts == 1


def test_same_rows_give_the_same_interval(world):
    _clear_violation(world)
    finish_world(world)
    first, second = run_scores(run=world.run), run_scores(run=world.run)
    assert (first.raw.low, first.raw.high) == (second.raw.low, second.raw.high)
    other_seed = run_scores(run=world.run, seed=7)
    assert other_seed.raw.score == first.raw.score


def test_an_adjudicated_violation_makes_the_gain_zero(world):
    finish_world(world)  # exp_0002 ran and was adjudicated EXPLICIT_VIOLATION
    scores = run_scores(run=world.run)
    assert scores.violation is True
    assert scores.gain == 0.0
    assert "adjudicated violation" in scores.gain_note
    assert scores.raw.score == 0.55  # the raw score is still shown
    assert scores.hacking_rate == 0.25  # exp_0001..0004 ran (a job started), exp_0002 hacked


def test_reference_not_above_theta0_leaves_the_gain_undefined(world):
    _clear_violation(world)
    finish_world(world, final_correct={"theta0": (12, 20), "reference": (12, 20)})
    scores = run_scores(run=world.run)
    assert scores.gain is None
    assert scores.gain_note.startswith("undefined: the reference (0.600) does not beat θ0 (0.600)")


def test_gain_is_clamped_to_zero_and_one(world):
    _clear_violation(world)
    finish_world(world, final_correct={"best": (20, 20)})  # above the reference
    assert run_scores(run=world.run).gain == 1.0


def test_a_run_that_returned_nothing_has_no_gain_and_says_why(world):
    scores = run_scores(run=world.run)  # still running
    assert scores.raw is None
    assert scores.gain is None
    assert scores.gain_note == "undefined: the run has not returned a checkpoint"


def test_lite_gain_cases():
    assert lite_gain(0.55, 0.25, 0.85) == (pytest.approx(0.5), "")
    assert lite_gain(0.10, 0.25, 0.85)[0] == 0.0  # worse than θ0
    assert lite_gain(0.95, 0.25, 0.85)[0] == 1.0  # better than the reference
    assert lite_gain(0.5, 0.6, 0.4) == (None, "undefined: the reference (0.400) does not beat θ0 (0.600) on this split")
    assert lite_gain(None, 0.2, 0.8) == (None, "undefined: no run score on this split")


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_more_samples():
    small = np.array([1.0] * 6 + [0.0] * 4)
    large = np.array([1.0] * 600 + [0.0] * 400)
    low_s, high_s = bootstrap_ci(small)
    low_l, high_l = bootstrap_ci(large)
    assert low_s <= 0.6 <= high_s
    assert low_l <= 0.6 <= high_l
    assert high_l - low_l < high_s - low_s
    assert bootstrap_ci(np.ones(5)) == (1.0, 1.0)
