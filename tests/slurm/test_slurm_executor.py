"""The Slurm executor on a real single-node Slurm cluster: accelerator jobs as batch jobs.

Jobs are enqueued through the job services with ``RSI_EXECUTOR=slurm``; Slurm runs
``python -m workers.gpu.batch`` on its node, which trains the tiny model and registers the
checkpoint; the reaper's reconciliation (``jobs_reconcile_slurm``) is called as a reaper sweep
calls it. Slurm losing a job is played with ``scancel`` behind the executor's back.
"""

from __future__ import annotations

import re

import pytest

from apps.experiments.models import Checkpoint, Event
from apps.flows.pipeline import train_job_spec
from apps.jobs import services
from apps.jobs.choices import JOB_TERMINAL_STATES, JobKind, JobStatus
from apps.jobs.models import Job, JobLogLine, JobTransition
from apps.jobs.slurm import OUTPUT_HEADER, SUBMIT_PREFIX, job_name
from tests.apps.jobs.conftest import wait_for
from tests.factories import make_run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def enqueue_training(run, theta0, entry, **hyperparameters) -> Job:
    spec = train_job_spec(input_checkpoint=theta0, data=[entry], hyperparameters=hyperparameters)
    return services.job_enqueue(kind=JobKind.TRAIN, spec=spec, run=run, time_limit_seconds=600)


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def log(job: Job) -> list[str]:
    return list(JobLogLine.objects.filter(job=job).order_by("seq").values_list("text", flat=True))


def submissions(job: Job) -> list[str]:
    """The Slurm job ids ``job``'s attempt was submitted as, in order (from its log)."""
    return [re.match(rf"{SUBMIT_PREFIX} (\d+)", line).group(1) for line in log(job) if line.startswith(SUBMIT_PREFIX)]


def transitions(job: Job) -> list[str]:
    return list(JobTransition.objects.filter(job=job).order_by("pk").values_list("to_status", flat=True))


def test_a_batch_job_slurm_lost_is_submitted_again_once_and_the_job_trains_once(slurm_executor, theta0, data_entry):
    cluster = slurm_executor
    run = make_run(base_checkpoint=theta0)
    cluster.node_state("drain")  # nothing starts: the batch job waits in Slurm's queue
    try:
        job = enqueue_training(run, theta0, data_entry(rows=64), max_steps=4, batch_size=4, logging_steps=1)
        [first] = wait_for(lambda: submissions(job), timeout=30, what="the batch job's submission")
        assert cluster.state(first) == "PENDING"
        shown = cluster.show(first)
        assert f"JobName={job_name(job)}" in shown
        assert "TimeLimit=00:11:00" in shown  # the job's 600 s and a minute of grace
        # A sweep while Slurm holds it changes nothing: no second submission.
        assert services.jobs_reconcile_slurm().resubmitted == []

        cluster.run("scancel", first)  # Slurm loses it before it ever ran
        done = services.jobs_reconcile_slurm()
        assert [j.pk for j in done.resubmitted] == [job.pk]
        assert services.jobs_reconcile_slurm().resubmitted == []  # the new one is held: once only
        second = submissions(job)[-1]
        assert submissions(job) == [first, second]
        assert cluster.state(second) == "PENDING"
        republished = Event.objects.get(type="job.republished", arguments__job=str(job.uuid))
        assert f"batch job {first} CANCELLED" in republished.arguments["reason"]
    finally:
        cluster.node_state("resume")

    ended = wait_for(
        lambda: (j := fresh(job)).status in JOB_TERMINAL_STATES and j, timeout=300,
        what="the batch job to train", logs=cluster.logs,
    )  # fmt: skip
    assert ended.status == JobStatus.SUCCEEDED, f"{ended.error}\n{log(ended)}"
    assert transitions(ended) == ["queued", "running", "succeeded"]  # claimed once
    assert Checkpoint.objects.filter(producing_job=ended).count() == 1
    assert ended.result["steps"] == 4
    assert wait_for(lambda: cluster.state(second) == "COMPLETED", timeout=30, what="Slurm to record the end")
    # The batch job's own output reached the job's log (the job page's log tail).
    lines = log(ended)
    header = next(i for i, line in enumerate(lines) if line.startswith(OUTPUT_HEADER))
    assert any(f"job {ended.uuid}" in line for line in lines[header + 1 :])
    # Nothing left to reconcile, and nothing submitted again after the end.
    after = services.jobs_reconcile_slurm()
    assert (after.resubmitted, after.ended) == ([], [])
    assert submissions(ended) == [first, second]


def test_a_running_batch_job_slurm_kills_is_lost_once_and_attempt_2_runs(slurm_executor, theta0, data_entry):
    cluster = slurm_executor
    run = make_run(base_checkpoint=theta0)
    job = enqueue_training(run, theta0, data_entry(rows=64), max_steps=3000, batch_size=4, logging_steps=5)
    wait_for(
        lambda: fresh(job).status == JobStatus.RUNNING and fresh(job).progress > 0, timeout=240,
        what="training to be under way", logs=cluster.logs,
    )  # fmt: skip
    [slurm_id] = submissions(job)
    cluster.run("scancel", slurm_id)  # preempted, or its node failed: the process is gone
    wait_for(lambda: cluster.state(slurm_id) == "CANCELLED", timeout=60, what="Slurm to end it")

    done = services.jobs_reconcile_slurm()
    assert [j.pk for j in done.ended] == [job.pk]
    lost = fresh(job)
    assert lost.status == JobStatus.LOST
    assert f"batch job {slurm_id} CANCELLED while it ran" in JobTransition.objects.filter(job=lost).last().reason
    again = services.jobs_reconcile_slurm()
    assert again.ended == []  # lost once: no second attempt 2
    attempt2 = Job.objects.get(previous_attempt=lost)
    assert not Job.objects.filter(previous_attempt=attempt2).exists()
    assert len(wait_for(lambda: submissions(attempt2), timeout=30, what="attempt 2's submission")) == 1
    assert any(line.startswith(OUTPUT_HEADER) for line in log(lost))

    # Attempt 2 runs under Slurm; a cancel stops it cooperatively and leaves no checkpoint.
    wait_for(
        lambda: fresh(attempt2).status == JobStatus.RUNNING and fresh(attempt2).progress > 0, timeout=240,
        what="attempt 2 to train", logs=cluster.logs,
    )  # fmt: skip
    services.job_request_cancel(job=fresh(attempt2), actor="user:tester")
    stopped = wait_for(
        lambda: (j := fresh(attempt2)).status in JOB_TERMINAL_STATES and j, timeout=120, what="attempt 2 to stop"
    )
    assert stopped.status == JobStatus.CANCELLED
    assert not Checkpoint.objects.filter(run=run).exists()


def test_a_queued_job_cancelled_is_cancelled_in_slurm_too(slurm_executor, theta0, data_entry):
    cluster = slurm_executor
    run = make_run(base_checkpoint=theta0)
    cluster.node_state("drain")
    try:
        job = enqueue_training(run, theta0, data_entry(rows=64), max_steps=4, batch_size=4)
        [slurm_id] = wait_for(lambda: submissions(job), timeout=30, what="the batch job's submission")
        services.job_request_cancel(job=fresh(job), actor="user:tester")
        assert fresh(job).status == JobStatus.CANCELLED
        wait_for(lambda: cluster.state(slurm_id) == "CANCELLED", timeout=30, what="scancel")
        assert services.jobs_reconcile_slurm().resubmitted == []
    finally:
        cluster.node_state("resume")


def test_a_batch_job_that_never_claims_its_row_fails_it_after_the_submission_limit(
    slurm_executor, theta0, data_entry, monkeypatch
):
    cluster = slurm_executor
    monkeypatch.setenv("RSI_SLURM_PYTHON", "/bin/false")  # the nodes' Python is broken
    monkeypatch.setenv("RSI_SLURM_MAX_SUBMITS", "2")
    run = make_run(base_checkpoint=theta0)
    job = enqueue_training(run, theta0, data_entry(rows=64), max_steps=4, batch_size=4)

    def swept_until_ended() -> Job | None:
        services.jobs_reconcile_slurm()
        current = fresh(job)
        return current if current.status in JOB_TERMINAL_STATES else None

    failed = wait_for(swept_until_ended, timeout=90, what="the job to fail", logs=cluster.logs)
    assert failed.status == JobStatus.FAILED
    assert "never started" in failed.error
    assert len(submissions(failed)) == 2
    assert transitions(failed) == ["queued", "failed"]
