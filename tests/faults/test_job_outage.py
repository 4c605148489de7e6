"""Jobs ride out a short database outage; one that cannot report for too long stops and is retried.

A real GPU-queue worker trains the minibench θ0 on the private servers while the test stops the
private PostgreSQL mid-training (issue 14: a 20 s outage killed the job in flight and left it
"running" until reaped).
"""

from __future__ import annotations

import time

import pytest
from django.db import connections

from apps.experiments.models import Checkpoint
from apps.jobs.choices import JOB_TERMINAL_STATES, JobStatus
from apps.jobs.models import Job, JobLogLine, JobTransition
from tests.faults.conftest import LOGGING_STEPS

pytestmark = pytest.mark.slow


def wait_for(predicate, *, timeout: float, what: str, logs=None):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - the database may be coming back
            connections.close_all()
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs() if logs else ''}")


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def outage(pg_cluster, seconds: float) -> None:
    connections.close_all()
    pg_cluster.stop()
    time.sleep(seconds)
    pg_cluster.start()


def test_a_training_job_rides_out_a_20_second_database_outage(project, pg_cluster, training):
    gpu = project("gpu", RSI_JOB_STALE_SECONDS="60")
    job = training(max_steps=400)
    wait_for(lambda: fresh(job).progress >= 0.05, timeout=300, what="training under way", logs=lambda: gpu.log("gpu"))

    outage(pg_cluster, 20)

    done = wait_for(lambda: (j := fresh(job)).status in JOB_TERMINAL_STATES and j, timeout=600,
                    what="the job to finish", logs=lambda: gpu.log("gpu"))  # fmt: skip
    assert done.status == JobStatus.SUCCEEDED, done.error
    assert not Job.objects.filter(previous_attempt=done).exists()  # no retry was needed
    # Every loss line the trainer logged is in the records, in order: the ones logged during the
    # outage were queued and written when the database came back.
    steps = [int(t.split()[1].rstrip(":")) for t in JobLogLine.objects.filter(job=done, text__startswith="step ")
             .order_by("seq").values_list("text", flat=True)]  # fmt: skip
    assert steps == sorted(steps)
    assert sorted(set(steps)) == list(range(LOGGING_STEPS, 401, LOGGING_STEPS))
    assert [p["step"] for p in done.metrics["points"]] == steps
    assert Checkpoint.objects.filter(producing_job=done).count() == 1


def test_a_job_that_cannot_report_past_its_stale_threshold_stops_and_is_retried(project, pg_cluster, training):
    gpu = project("gpu", RSI_JOB_STALE_SECONDS="6")
    job = training(max_steps=600)
    wait_for(lambda: fresh(job).progress >= 0.05, timeout=300, what="training under way", logs=lambda: gpu.log("gpu"))

    outage(pg_cluster, 10)

    first = wait_for(lambda: (j := fresh(job)).status in JOB_TERMINAL_STATES and j, timeout=120,
                     what="attempt 1 to end", logs=lambda: gpu.log("gpu"))  # fmt: skip
    assert first.status == JobStatus.LOST
    reason = JobTransition.objects.filter(job=first).order_by("pk").last().reason
    # Recorded by the worker that gave up, or by a reaper that saw the stale heartbeat first.
    assert "could not report" in reason or "no heartbeat" in reason
    assert "no report reached the database" in gpu.log("gpu")  # the body was told to stop
    assert not Checkpoint.objects.filter(producing_job=first).exists()
    second = wait_for(lambda: Job.objects.filter(previous_attempt=first).first(), timeout=60, what="attempt 2")
    assert second.attempt == 2
    assert second.spec == first.spec
    assert second.status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED)
