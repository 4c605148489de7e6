"""RunningJob: the heartbeat thread, and the three reasons a runner is told to stop.

Transactional: the heartbeat thread has its own database connection and must see committed rows.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs import services
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job
from rsiweb.celery import app as celery_app
from tests.apps.jobs.conftest import wait_for
from workers.data import tasks as data_tasks
from workers.gpu import tasks as gpu_tasks
from workers.runtime import RunningJob

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fast_beats(settings):
    settings.RSI_JOB_HEARTBEAT_SECONDS = 0.1


def claimed(run, **overrides) -> Job:
    job = services.job_enqueue(kind=JobKind.TRAIN, spec={"x": 1}, run=run, **overrides)
    return services.job_claim(job_id=job.pk, worker="this-host:1")


def test_the_heartbeat_thread_keeps_the_row_alive_and_carries_progress(run):
    job = claimed(run)
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=60))

    with RunningJob(job) as running:
        running.on_progress(0.4)
        wait_for(lambda: Job.objects.get(pk=job.pk).progress == 0.4, timeout=5, what="progress to be written")
        assert not running.should_stop()

    beat = Job.objects.get(pk=job.pk).heartbeat_at
    assert timezone.now() - beat < timedelta(seconds=2)
    assert services.jobs_reap_stale(stale_after_seconds=30) == []


def test_a_cancel_request_reaches_should_stop_and_ends_the_job_cancelled(run):
    job = claimed(run)
    with RunningJob(job) as running:
        services.job_request_cancel(job=job, actor="user:alice")
        wait_for(running.should_stop, timeout=5, what="should_stop after a cancel request")
        running.finish_stopped()
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED


def test_the_time_limit_stops_the_runner_cooperatively_and_fails_the_job(run):
    job = claimed(run, time_limit_seconds=1)
    with RunningJob(job) as running:
        assert not running.should_stop()
        time.sleep(1.1)
        assert running.should_stop()
        running.finish_stopped()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert "time limit of 1s exceeded" in job.error


def test_a_reaped_attempt_learns_it_is_lost_and_records_nothing(run):
    job = claimed(run)
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=600))
    services.jobs_reap_stale(stale_after_seconds=60)

    with RunningJob(job) as running:
        wait_for(running.should_stop, timeout=5, what="should_stop for a job reaped from under it")
        running.finish_stopped()

    lost = Job.objects.get(pk=job.pk)
    assert lost.status == JobStatus.LOST
    assert Job.objects.get(previous_attempt=lost).status == JobStatus.QUEUED


@pytest.mark.django_db(transaction=False)
def test_every_job_task_is_acked_late_and_killed_one_grace_after_its_soft_limit():
    assert data_tasks.data_job_task.name in celery_app.tasks
    assert gpu_tasks.train_job_task.name in celery_app.tasks
    for name in set(services.TASK_NAMES.values()):
        task = celery_app.tasks[name]
        assert task.acks_late, name
        assert task.reject_on_worker_lost, name
        assert task.soft_time_limit > 0, name
        assert task.time_limit == task.soft_time_limit + services.HARD_LIMIT_GRACE_SECONDS, name
