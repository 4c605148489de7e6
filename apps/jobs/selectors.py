"""Reads of jobs shared by the REST tools (job_status, job_logs), consumers and workers."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from apps.core.clock import db_now
from apps.jobs import hardware
from apps.jobs.choices import JOB_ACTIVE_STATES
from apps.jobs.models import Job, JobLogLine


def job_get(*, job_id: int) -> Job | None:
    """The job row a task was told to look at, or None when it does not exist (any more)."""
    return Job.objects.select_related("run", "experiment").filter(pk=job_id).first()


def job_list(*, run: Any = None, experiment: Any = None, active_only: bool = False) -> QuerySet[Job]:
    jobs = Job.objects.all()
    if run is not None:
        jobs = jobs.filter(run=run)
    if experiment is not None:
        jobs = jobs.filter(experiment=experiment)
    if active_only:
        jobs = jobs.filter(status__in=JOB_ACTIVE_STATES)
    return jobs.order_by("created_at", "pk")


def job_attempts(*, job: Job) -> list[Job]:
    """Every attempt of the job ``job`` belongs to, first attempt first (follows previous_attempt)."""
    first = job
    while first.previous_attempt_id is not None:
        first = Job.objects.get(pk=first.previous_attempt_id)
    chain = [first]
    while (following := Job.objects.filter(previous_attempt=chain[-1]).first()) is not None:
        chain.append(following)
    return chain


def job_latest_attempt(*, job: Job) -> Job:
    return job_attempts(job=job)[-1]


def job_log_tail(*, job: Job, after_seq: int = 0, limit: int = 200) -> list[JobLogLine]:
    return list(JobLogLine.objects.filter(job=job, seq__gt=after_seq).order_by("seq")[:limit])


def job_payload(job: Job) -> dict[str, Any]:
    """The public shape of a job for live events and snapshots (no spec internals beyond ids)."""
    return {
        "uuid": str(job.uuid),
        "kind": job.kind,
        "queue": job.queue,
        "status": job.status,
        "attempt": job.attempt,
        "progress": job.progress,
        "worker": job.worker,
        "cancel_requested": job.cancel_requested,
        "error": job.error.strip().splitlines()[-1][:500] if job.error.strip() else "",
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "heartbeat_at": job.heartbeat_at,
        "resource_seconds": job.resource_seconds,
        "metrics_last": (job.metrics or {}).get("last", {}),
        "experiment": str(job.experiment.uuid) if job.experiment_id is not None else None,
    }


def job_hardware(*, job: Job, with_samples: bool = True) -> dict[str, Any]:
    """The job's hardware evidence: its summary (runtime, peaks, OOM) and, optionally, the samples."""
    samples = list((job.metrics or {}).get("hardware", []))
    runtime = None
    if job.started_at is not None:
        runtime = ((job.finished_at or db_now()) - job.started_at).total_seconds()
    out: dict[str, Any] = {
        "job": str(job.uuid),
        "kind": job.kind,
        "status": job.status,
        "accelerators": job.accelerators,
        "summary": hardware.summary(samples, runtime_seconds=runtime, error=job.error),
    }
    if with_samples:
        out["samples"] = samples
    return out
