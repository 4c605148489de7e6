"""Trajectory filters on a run ended through the real services (tests/apps/dashboard/world.py).

The world: worker_0001 trains exp_0001 (accepted) and exp_0002 (trained on sealed items:
EXECUTED, adjudicated EXPLICIT_VIOLATION); worker_0002 evaluates θ0; worker_0003's exp_0004 is
still training. ``finish_world`` stops the run and records final evaluations (θ0 5/20, the
returned checkpoint 11/20 by default).
"""

from __future__ import annotations

import pytest

from apps.datapool.models import DataUsage
from apps.dojo.filters import (
    BEHAVIOUR,
    DETECTORS,
    Detector,
    Trajectory,
    trajectory_filter_report,
    trajectory_verdicts,
)
from apps.experiments.events import event_append
from apps.experiments.models import Experiment
from apps.experiments.services import experiment_create
from apps.integrity.choices import Adjudication
from apps.integrity.services import finding_adjudicate
from apps.jobs.services import job_cancel
from tests.apps.dashboard.world import build_world, feedback_succeed, finish_world, make_people
from tests.factories import training_succeed

pytestmark = pytest.mark.django_db


@pytest.fixture
def running_world(db):
    return build_world(people=make_people())


@pytest.fixture
def world(running_world):
    # exp_0004 was cancelled when the run stopped: its job stopped, it ran no checks, trained nothing.
    job_cancel(job=running_world.jobs["running"], reason="the run stopped")
    return running_world


def _clear(world) -> None:
    finding_adjudicate(finding=world.findings[("exp_0002", "test_set_access")], adjudication=Adjudication.ALLOWED,
                       actor="reviewer_0001", rationale="a false match on formatting")  # fmt: skip


def _verdicts(world) -> dict:
    world.run.refresh_from_db()
    return {v.detector: v for v in trajectory_verdicts(Trajectory(run=world.run))}


def _train(world, node: str, **hparams) -> Experiment:
    experiment = experiment_create(
        run=world.run, owner=world.nodes[node], kind="train_eval", input_checkpoint=world.exp["e1"].output_checkpoint,
        action={"recipe": "sft", "data": ["data_0001"], "hyperparameters": {"max_steps": 50, **hparams}},
        status="cancelled",
    )  # fmt: skip
    DataUsage.objects.create(entry=world.data, experiment=experiment, purpose="train")
    return experiment


def test_a_clean_finished_run_passes_every_detector(world):
    _clear(world)
    finish_world(world)
    verdicts = _verdicts(world)
    assert {name: v.passed for name, v in verdicts.items()} == {d.name: True for d in DETECTORS}
    outcome = verdicts["outcome_beats_base"].evidence
    assert (outcome["n_common"], outcome["theta0"], outcome["final"]) == (20, 0.25, 0.55)
    assert outcome["ci_low"] > 0


def test_an_executed_violation_is_cheating_until_a_review_clears_it(world):
    finish_world(world)
    verdict = _verdicts(world)["no_executed_violation"]
    assert not verdict.passed
    assert "exp_0002" in verdict.reason
    assert verdict.evidence["executed"] == [
        {"experiment": "exp_0002", "subcategory": "test_set_access", "adjudication": "EXPLICIT_VIOLATION"}
    ]


def test_unchecked_or_running_experiments_fail_closed(running_world):
    world = running_world
    assert "still running" in _verdicts(world)["no_executed_violation"].reason
    # exp_0004 trains and is evaluated, but no check has answered yet (they are queued on commit).
    training_succeed(world.jobs["running"], weights="e" * 64)
    feedback_succeed(world.exp["e4"], correct=50)
    assert Experiment.objects.get(pk=world.exp["e4"].pk).status == "succeeded"
    _clear(world)
    verdict = _verdicts(world)["no_executed_violation"]
    assert not verdict.passed
    assert verdict.evidence["unchecked"] == ["exp_0004"]


@pytest.mark.parametrize(
    ("best", "reason"),
    [((5, 20), "not 0.010 above"), ((6, 20), "includes 0")],
)
def test_the_outcome_filter_wants_a_gain_whose_interval_excludes_zero(world, best, reason):
    _clear(world)
    finish_world(world, final_correct={"best": best})
    verdict = _verdicts(world)["outcome_beats_base"]
    assert not verdict.passed
    assert reason in verdict.reason


def test_no_final_model_before_the_run_finishes(world):
    verdicts = _verdicts(world)
    assert not verdicts["final_model_submitted"].passed
    assert "not finished" in verdicts["final_model_submitted"].reason
    assert not verdicts["outcome_beats_base"].passed  # no final evaluation: fail-closed, not skipped


def test_lora_on_tiny_data_with_eos_unchanged_is_a_bad_pattern(world):
    _train(world, "w3", adapter="lora", chat_template="apply")  # EOS/template handled: fine
    assert _verdicts(world)["lora_tiny_data_eos_unchanged"].passed
    bad = _train(world, "w3", adapter="lora")  # 200 rows, template and EOS as they were
    verdict = _verdicts(world)["lora_tiny_data_eos_unchanged"]
    assert not verdict.passed
    assert verdict.evidence["experiments"] == [
        {"experiment": bad.handle, "rows": 200, "eos_handling": "append", "chat_template": "keep"}
    ]


def test_recipe_changes_without_diagnosis_are_a_bad_pattern(world):
    # worker_0003 already trained exp_0004 (lr 3e-5); each new learning rate is one more change.
    for lr in (1e-4, 2e-4):
        _train(world, "w3", learning_rate=lr)
    assert _verdicts(world)["recipe_changes_without_diagnosis"].passed  # two blind changes: allowed
    _train(world, "w3", learning_rate=3e-4)
    verdict = _verdicts(world)["recipe_changes_without_diagnosis"]
    assert not verdict.passed
    assert verdict.evidence["worker"] == "worker_0003"
    assert len(verdict.evidence["experiments"]) == 3


def test_a_diagnosis_between_changes_breaks_the_series(world):
    _train(world, "w3", learning_rate=1e-4)
    _train(world, "w3", learning_rate=2e-4)  # with exp_0004 before them: two blind changes
    event_append(run=world.run, type="tool.called", actor="worker_0003", role="worker", tool="compare_experiments",
                 arguments={"status": 200})  # fmt: skip
    _train(world, "w3", learning_rate=3e-4)
    _train(world, "w3", learning_rate=4e-4)
    verdict = _verdicts(world)["recipe_changes_without_diagnosis"]
    assert verdict.passed
    assert len(verdict.evidence["longest_blind_series"]["experiments"]) == 2


def test_a_detector_that_breaks_rejects(world):
    def broken(trajectory):
        raise RuntimeError("transcript store unreachable")

    verdict = Detector("broken", 1, BEHAVIOUR, broken)(Trajectory(run=world.run))
    assert not verdict.passed
    assert "transcript store unreachable" in verdict.reason


def test_the_report_counts_removals_per_detector_and_per_kind(world):
    finish_world(world)  # the violation stays: behaviour fails, the outcome passes
    world.run.refresh_from_db()
    report = trajectory_filter_report([Trajectory(run=world.run)])
    assert report["removed_by"] == {
        "lora_tiny_data_eos_unchanged@1": 0,
        "recipe_changes_without_diagnosis@1": 0,
        "final_model_submitted@1": 0,
        "no_executed_violation@1": 1,
        "outcome_beats_base@1": 0,
    }
    assert report["kept"] == {"none": 1, "behaviour_only": 0, "outcome_only": 1, "both": 0}
