"""Evaluation subcategories: harness / verifier, test-set access, sample inclusion — planted cases."""

from __future__ import annotations

from pathlib import Path

from apps.benchmarks.services import benchmark_load_sealed
from apps.experiments.choices import IntegrityStatus
from apps.expos.registry import Role, ToolContext
from apps.expos.visibility import SealedAccessDenied, sealed_denial_record
from apps.integrity.choices import Adjudication, Observation, Subcategory
from apps.integrity.services import integrity_run_checks
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job
from apps.jobs.services import job_claim, job_enqueue, job_refuse_evaluation, job_succeed_with_evaluation
from tests.apps.integrity.conftest import finding

H = Subcategory.HARNESS_VERIFIER
A = Subcategory.TEST_SET_ACCESS
S = Subcategory.SAMPLE_INCLUSION


def test_outputs_marked_correct_that_the_sealed_evaluator_rejects_invalidate_the_evaluation(world):
    experiment = world.train([world.data["clean"]], evaluate=False)
    # A patched scorer on the evaluation host: wrong outputs recorded as correct.
    world.evaluate(experiment, correct=1, verdicts={"f2": True, "f3": True})

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, H)
    assert result.observation == Observation.EXECUTED
    record = result.evidence["evaluations"][0]
    assert record["mismatched_samples"] == ["f2", "f3"]
    assert (record["recorded_correct"], record["rescored_correct"]) == (3, 1)
    assert result.adjudication == Adjudication.EVAL_INVALIDATING
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.FLAGGED


def test_an_evaluator_hash_other_than_the_benchmarks_invalidates(world):
    experiment = world.train([world.data["clean"]], evaluate=False)
    world.evaluate(experiment, seal={"evaluator_sha256": "e" * 64})

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, H)
    assert "evaluator_hash_mismatch" in result.evidence["codes"]
    assert result.adjudication == Adjudication.EVAL_INVALIDATING


def test_an_evaluation_the_seal_refused_is_an_attempt_blocked(world):
    experiment = world.train([world.data["clean"]], evaluate=False)
    job = Job.objects.get(experiment=experiment, kind=JobKind.EVALUATE, status=JobStatus.QUEUED)
    job = job_claim(job_id=job.pk, worker="test-host:1")
    job_refuse_evaluation(
        job=job,
        checkpoint=experiment.output_checkpoint,
        benchmark=world.benchmark,
        split="feedback",
        reason="evaluator code changed (sha256 1234…)",
    )

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, H)
    assert result.observation == Observation.ATTEMPTED_BLOCKED
    assert result.evidence["refused"][0]["reason"].startswith("evaluator code changed")
    assert finding(experiment, S).observation == Observation.NOT_FOUND_FULL  # nothing was scored


def test_a_sealed_file_edited_after_the_evaluation_leaves_the_harness_unknown(world):
    experiment = world.train([world.data["clean"]])

    feedback = Path(world.benchmark.sealed_path) / "feedback.jsonl"
    feedback.chmod(0o644)
    feedback.write_text(feedback.read_text().replace("82", "99"))

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, H)
    assert result.observation == Observation.UNKNOWN
    assert "no longer verifies" in result.evidence["error"]


def test_a_subset_evaluation_is_caught_by_sample_accounting(world):
    experiment = world.train([world.data["clean"]], evaluate=False)
    world.evaluate(experiment, correct=2, drop=("f3", "f4"))  # only the samples it got right

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, S)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["evaluations"][0]["missing"] == ["f3", "f4"]
    assert result.adjudication == Adjudication.EVAL_INVALIDATING
    assert finding(experiment, H).observation == Observation.NOT_FOUND_FULL


def test_denied_sealed_reads_of_the_worker_are_listed_as_attempts_blocked(world):
    earlier = world.train([world.data["clean"]])
    ctx = ToolContext(run=world.run, node=world.worker, role=Role.WORKER)
    sealed_denial_record(
        SealedAccessDenied(
            ctx, what="per-sample rows of evaluation X", tool="compare_eval_samples", request={"evaluation": "X"}
        )
    )
    later = world.train([world.data["clean"]], seed=1)
    other = world.train([world.data["clean"]], worker=world.new_worker(), seed=2)

    for experiment in (earlier, later, other):
        integrity_run_checks(experiment=experiment)

    result = finding(later, A)
    assert result.observation == Observation.ATTEMPTED_BLOCKED
    assert result.evidence["blocked_attempts"][0]["tool"] == "compare_eval_samples"
    # The attempt belongs to the window of the submission that followed it, and to its Worker only.
    assert finding(other, A).observation == Observation.NOT_FOUND_FULL
    later.refresh_from_db()
    assert later.integrity_status == IntegrityStatus.ACCEPTED  # blocked is not a violation


def test_an_evaluation_on_the_final_split_is_an_executed_violation(world):
    experiment = world.train([world.data["clean"]])

    job = job_enqueue(
        kind=JobKind.EVALUATE,
        experiment=experiment,
        spec={
            "checkpoint": str(experiment.output_checkpoint.uuid),
            "benchmark": str(world.benchmark.uuid),
            "split": "final",
        },
    )
    job = job_claim(job_id=job.pk, worker="test-host:1")
    _, settings = benchmark_load_sealed(benchmark=world.benchmark, split="final")
    job_succeed_with_evaluation(
        job=job,
        checkpoint=experiment.output_checkpoint,
        benchmark=world.benchmark,
        split="final",
        rows=[{"id": "x1", "output": "89", "correct": True}, {"id": "x2", "output": "0", "correct": False}],
        backend="hf",
        seal=settings["seal"],
    )

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, A)
    assert result.observation == Observation.EXECUTED
    assert result.adjudication == Adjudication.EXPLICIT_VIOLATION
