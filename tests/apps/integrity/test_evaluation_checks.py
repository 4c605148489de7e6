"""Evaluation subcategories: harness / verifier, test-set access, sample inclusion — planted cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.benchmarks.services import benchmark_load_sealed
from apps.datapool.models import DataEntry
from apps.experiments.choices import IntegrityStatus
from apps.expos.registry import Role, ToolContext
from apps.expos.visibility import SealedAccessDenied, sealed_denial_record
from apps.flows.submissions import submission_create
from apps.integrity.choices import Adjudication, Observation, Subcategory
from apps.integrity.models import BlockedAttempt
from apps.integrity.services import integrity_run_checks
from apps.integrity.submission_parts import SubmissionSubjects
from apps.integrity.submission_refusals import SubmissionRefused
from apps.integrity.submission_review import submission_parse
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


def _refused_final_split(world, worker, variant: int) -> BlockedAttempt:
    """A Worker asks for the sealed final split through the submission review (the real path): refused
    with nothing created, and recorded after the rollback as the REST layer does."""
    specs = [
        {"kind": "eval_only", "eval": {"split": "final"}},
        {"kind": "eval_only", "eval": {"split": "FINAL"}, "claim": f"try {variant}"},
        {
            "kind": "train_eval",
            "train": {"recipe": "sft", "datasets": [world.data["clean"]]},
            "eval": {"split": "test"},
        },
    ]
    request = submission_parse(specs[variant % len(specs)])
    subjects = SubmissionSubjects(
        input_checkpoint=world.theta0,
        checkpoint_visible=True,
        parents=[],
        datasets=_entries(world),
    )
    with pytest.raises(SubmissionRefused) as excinfo:
        submission_create(worker=worker, request=request, subjects=subjects)
    attempts = excinfo.value.record()
    assert {a.subcategory for a in attempts} == {A}
    return attempts[0]


def _entries(world):
    return {e.handle: e for e in DataEntry.objects.filter(handle__in=world.data.values())}


def _denied_read(world, worker, what: str) -> None:
    ctx = ToolContext(run=world.run, node=worker, role=Role.WORKER)
    sealed_denial_record(SealedAccessDenied(ctx, what=what, tool="compare_eval_samples", request={"x": what}))


def test_a_refusal_marks_only_its_actors_next_submission(world):
    """Several Workers, several submissions each, refusals between them: each refusal is listed on
    exactly one experiment — its actor's first submission after it — and on no other."""
    workers = [world.worker, world.new_worker("second"), world.new_worker("third")]
    # Interleaved: worker 0 refuses twice before one submission, worker 1 between its second and
    # third, worker 2 never; a refusal after a Worker's last submission marks nothing (yet).
    plan = [
        ("submit", 0), ("submit", 1), ("submit", 2),
        ("refuse", 0), ("deny", 0), ("submit", 1), ("refuse", 1),
        ("submit", 0), ("submit", 2), ("submit", 0),
        ("submit", 1), ("submit", 2), ("refuse", 0), ("refuse", 2),
    ]  # fmt: skip
    experiments: dict[int, list] = {i: [] for i in range(len(workers))}
    expected: dict[int, set[str]] = {}  # experiment pk -> the attempts (by time) it must list
    pending: dict[int, list[str]] = {i: [] for i in range(len(workers))}
    for step, (what, who) in enumerate(plan):
        worker = workers[who]
        if what == "submit":
            experiment = world.train([world.data["clean"]], worker=worker, seed=step)
            experiments[who].append(experiment)
            expected[experiment.pk] = set(pending[who])
            pending[who] = []
        else:
            if what == "refuse":
                _refused_final_split(world, worker, step)
            else:
                _denied_read(world, worker, f"per-sample rows {step}")
            newest = BlockedAttempt.objects.filter(subcategory=A).latest("pk")
            assert newest.node_id == worker.pk
            pending[who].append(newest.created_at.isoformat())
    assert BlockedAttempt.objects.filter(subcategory=A).count() == 5

    for per_worker in experiments.values():
        for experiment in per_worker:
            integrity_run_checks(experiment=experiment)
    marked: dict[str, int] = {}
    for who, per_worker in experiments.items():
        for experiment in per_worker:
            result = finding(experiment, A)
            listed = {a["at"] for a in result.evidence["blocked_attempts"]}
            assert listed == expected[experiment.pk], (who, experiment.handle)
            want = Observation.ATTEMPTED_BLOCKED if expected[experiment.pk] else Observation.NOT_FOUND_FULL
            assert result.observation == want, (who, experiment.handle)
            for reason in listed:
                marked[reason] = marked.get(reason, 0) + 1
    # Each attempt before its Worker's last submission is on exactly one experiment; the two after
    # the last submissions (workers 0 and 2) are on none.
    assert sorted(marked.values()) == [1, 1, 1]
    assert sum(len(v) for v in pending.values()) == 2
    assert not set(pending[0]) & set(marked)
    assert not set(pending[2]) & set(marked)
    # A blocked attempt is not a violation: the marked experiments are still accepted.
    marked_pk = [pk for pk, reasons in expected.items() if reasons]
    assert len(marked_pk) == 2
    for experiment in (e for per in experiments.values() for e in per if e.pk in marked_pk):
        experiment.refresh_from_db()
        assert experiment.integrity_status == IntegrityStatus.ACCEPTED


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
