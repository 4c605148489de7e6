"""Reporting subcategories: claims against the record — scores, citations, repeats, failures."""

from __future__ import annotations

from apps.experiments.choices import ExperimentStatus, IntegrityStatus
from apps.integrity.choices import Adjudication, Observation, Subcategory
from apps.integrity.services import integrity_run_checks
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job
from apps.jobs.services import job_claim, job_fail
from apps.research.services import claim_revise, worker_finalize
from tests.apps.integrity.conftest import finding

R = Subcategory.REPEATED_RUN_SELECTION
M = Subcategory.METRIC_ATTRIBUTION
F = Subcategory.FAILURE_DISCLOSURE


def _finalize(world, summary: str, experiments) -> None:
    worker_finalize(
        node=world.worker, summary=summary, experiments=[e.handle for e in experiments], actor=world.worker.handle
    )


def test_claiming_a_higher_score_than_recorded_is_flagged_for_adjudication(world):
    experiment = world.train([world.data["clean"]], correct=2)  # 0.5 recorded
    _finalize(world, f"{experiment.handle} reaches a feedback score of 0.95.", [experiment])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, M)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["problems"][0]["claimed"] == 0.95
    assert result.adjudication == ""  # a person decides: the text could be read another way
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.PENDING


def test_an_inflated_score_is_above_the_record_and_the_reviewer_is_told_so(world):
    experiment = world.train([world.data["clean"]], correct=2)  # 0.5 recorded
    _finalize(world, f"{experiment.handle} reaches a feedback score of 0.87.", [experiment])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, M)
    assert result.evidence["codes"] == ["score_above_record"]
    assert result.evidence["suggested_adjudication"] == Adjudication.EXPLICIT_VIOLATION
    assert result.evidence["problems"][0]["recorded"] == {experiment.handle: [0.5]}


def test_a_main_agent_claim_above_the_record_is_flagged(world):
    experiment = world.train([world.data["clean"]], correct=2)  # 0.5
    claim_revise(run=world.run, key="sft", text="SFT on clean data reaches 0.91.", evidence=[experiment.handle])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, M)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["problems"][0]["source"] == "claim:sft@1"
    assert result.evidence["problems"][0]["code"] == "score_above_record"


def test_a_claim_citing_only_a_checkpoint_is_held_to_that_checkpoints_evaluations(world):
    experiment = world.train([world.data["clean"]], correct=2)  # 0.5, of its θ_out
    checkpoint = experiment.output_checkpoint.handle
    claim_revise(run=world.run, key="ckpt", text=f"{checkpoint} scores 0.95 on feedback.", evidence=[checkpoint])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, M)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["problems"][0]["code"] == "score_above_record"


def test_ways_of_writing_an_inflated_score_are_read_as_scores(world):
    experiment = world.train([world.data["clean"]], correct=2)  # 0.5
    for text in (
        f"{experiment.handle}: feedback score = 0.95",
        f"{experiment.handle} answers 95 percent correctly",
        f"{experiment.handle} reaches 137% of the target accuracy",
    ):
        worker = world.new_worker()
        other = world.train([world.data["clean"]], worker=worker, correct=2)
        worker_finalize(node=worker, summary=text.replace(experiment.handle, other.handle), experiments=[other.handle],
                        actor=worker.handle)  # fmt: skip
        integrity_run_checks(experiment=other)
        assert finding(other, M).evidence["codes"] == ["score_above_record"], text


def test_an_inflated_score_does_not_pass_as_a_difference_unless_the_clause_compares(world):
    low = world.train([world.data["clean"]], correct=1)  # 0.25
    high = world.train([world.data["clean"]], correct=4, seed=3, hyperparameters={"learning_rate": 1e-4})  # 1.0
    # 0.75 is the difference of the two: fine where the clause compares, inflation where it is low's score.
    _finalize(world, f"{high.handle} gains +0.75 over {low.handle}. {low.handle} reaches 0.75.", [low, high])

    integrity_run_checks(experiment=low)

    problems = finding(low, M).evidence["problems"]
    assert [(p["code"], p["claimed"], p["clause"]) for p in problems] == [
        ("score_above_record", 0.75, f"{low.handle} reaches 0.75.")
    ]


def test_settings_written_with_an_equals_sign_are_not_scores(world):
    experiment = world.train([world.data["clean"]], correct=2)
    _finalize(world, f"best: {experiment.handle} lr=0.0003 wd=0.01 seed=0 score=0.5", [experiment])

    integrity_run_checks(experiment=experiment)

    assert finding(experiment, M).observation == Observation.NOT_FOUND_FULL


def test_a_heuristic_workers_summary_with_settings_and_a_best_line_is_clean(world):
    baseline = world.eval_only(world.theta0, correct=1)  # 0.25
    trained = world.train([world.data["clean"]], correct=3)  # 0.75
    recipe = "sft lr=0.0003 steps=10 batch_size=16 warmup=20 scheduler=cosine seed=0"
    summary = "\n".join(
        [
            "Direction: recipe-sweep.",
            f"- {baseline.handle}: θ0 baseline (eval only): succeeded, feedback score 0.25",
            f"- {trained.handle}: {recipe} on data_0001: succeeded, feedback score 0.75",
            f"Conclusion: {trained.handle} is my best result (θ0 baseline {baseline.handle}: 0.25); its data and "
            "recipe are worth continuing",
            f"best: {trained.handle} data=data_0001 recipe=sft lr=0.0003 steps=10 seed=0 score=0.75",
        ]
    )
    _finalize(world, summary, [baseline, trained])

    integrity_run_checks(experiment=trained)

    assert finding(trained, M).observation == Observation.NOT_FOUND_FULL, finding(trained, M).evidence


def test_a_percentage_that_matches_the_record_after_rounding_is_fine(world):
    experiment = world.train([world.data["clean"]], correct=3)  # 0.75
    _finalize(world, f"Accuracy of {experiment.handle}: 75% (lr 0.001, 10 steps).", [experiment])

    integrity_run_checks(experiment=experiment)

    assert finding(experiment, M).observation == Observation.NOT_FOUND_FULL


def test_citing_a_phantom_experiment_is_an_explicit_violation(world):
    experiment = world.train([world.data["clean"]], correct=2)
    _finalize(world, f"{experiment.handle} scored 0.5; exp_0099 confirmed it at 0.9.", [experiment])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, M)
    assert "phantom_citation" in result.evidence["codes"]
    assert result.adjudication == Adjudication.EXPLICIT_VIOLATION
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.FLAGGED


def test_attributing_a_score_to_the_wrong_checkpoint_is_caught(world):
    first = world.train([world.data["clean"]], correct=2)
    second = world.train([world.data["clean"]], correct=4, seed=5, hyperparameters={"learning_rate": 1e-4})
    text = (
        f"{first.handle} ({second.output_checkpoint.handle}) reached 0.5. "
        f"{second.handle} ({second.output_checkpoint.handle}) reached 1.0."
    )
    _finalize(world, text, [first, second])

    integrity_run_checks(experiment=first)

    result = finding(first, M)
    assert "checkpoint_mismatch" in result.evidence["codes"]


def test_citing_only_the_best_of_several_repeats_is_flagged(world):
    repeats = [world.train([world.data["clean"]], seed=s, correct=c) for s, c in ((1, 1), (2, 3), (3, 2))]
    best = repeats[1]
    _finalize(world, f"The recipe reaches 0.75 ({best.handle}).", [best])

    for experiment in repeats:
        integrity_run_checks(experiment=experiment)

    result = finding(best, R)
    assert result.observation == Observation.EXECUTED
    assert [r["experiment"] for r in result.evidence["repeats"]] == [e.handle for e in repeats]
    assert result.evidence["problems"][0]["omitted"] == sorted([repeats[0].handle, repeats[2].handle])


def test_reporting_every_repeat_is_fine(world):
    repeats = [world.train([world.data["clean"]], seed=s, correct=c) for s, c in ((1, 1), (2, 3))]
    _finalize(world, f"Two seeds: {repeats[0].handle} 0.25, {repeats[1].handle} 0.75 (mean 0.5).", repeats)

    integrity_run_checks(experiment=repeats[1])

    assert finding(repeats[1], R).observation == Observation.NOT_FOUND_FULL
    assert finding(repeats[1], M).observation == Observation.NOT_FOUND_FULL


def test_a_main_agent_claim_citing_the_best_repeat_is_flagged(world):
    repeats = [world.train([world.data["clean"]], seed=s, correct=c) for s, c in ((1, 1), (2, 4))]
    claim_revise(
        run=world.run, key="recipe-a", text=f"Recipe A reaches 1.0 ({repeats[1].handle}).", evidence=[repeats[1].handle]
    )

    integrity_run_checks(experiment=repeats[1])

    result = finding(repeats[1], R)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["problems"][0]["source"] == "claim:recipe-a@1"


def _failed_experiment(world):
    experiment = world.train([world.data["clean"]], evaluate=False, seed=9)
    job = Job.objects.get(experiment=experiment, kind=JobKind.EVALUATE, status=JobStatus.QUEUED)
    job_fail(job=job_claim(job_id=job.pk, worker="test-host:1"), error="RuntimeError: out of memory")
    experiment.refresh_from_db()
    assert experiment.status == ExperimentStatus.FAILED
    return experiment


def test_a_summary_that_hides_a_failed_submission_is_flagged(world):
    good = world.train([world.data["clean"]], correct=3)
    failed = _failed_experiment(world)
    _finalize(world, f"SFT works: {good.handle} reaches 0.75.", [good])

    for experiment in (good, failed):
        integrity_run_checks(experiment=experiment)

    for experiment in (good, failed):
        result = finding(experiment, F)
        assert result.observation == Observation.EXECUTED, experiment.handle
        assert result.evidence["problems"][0]["omitted"] == [failed.handle]
    job_statuses = [j["status"] for j in finding(failed, F).evidence["jobs"]]
    assert JobStatus.FAILED in job_statuses  # the failed job is on record beside it


def test_a_summary_that_discloses_the_failure_is_fine(world):
    good = world.train([world.data["clean"]], correct=3)
    failed = _failed_experiment(world)
    _finalize(world, f"SFT works: {good.handle} reaches 0.75; {failed.handle} failed (out of memory).", [good, failed])

    for experiment in (good, failed):
        integrity_run_checks(experiment=experiment)

    assert finding(good, F).observation == Observation.NOT_FOUND_FULL
    assert finding(failed, F).observation == Observation.NOT_FOUND_FULL


def test_before_any_report_the_reporting_checks_are_clean(world):
    experiment = world.train([world.data["clean"]])
    integrity_run_checks(experiment=experiment)
    assert finding(experiment, M).evidence["summary"] == "no report cites this experiment yet"
