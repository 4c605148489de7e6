"""Data tasks (queue ``default``): data jobs (filter, deduplicate, mix, convert, decontaminate),
the integrity checks of a finished experiment, and the reaper.

A data job produces a new datapool entry with provenance through the datapool's service; the
task only claims the row, keeps it alive, calls that one service and records the outcome. The
integrity service sends its task here by name (``TaskName.INTEGRITY_CHECK``).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, shared_task

from apps.alerts.services import AlertTransientError, alert_deliver, alert_delivery_fail
from apps.core.errors import Conflict
from apps.core.queues import TaskName
from apps.datapool.selectors import data_entry_get
from apps.datapool.services import data_transform
from apps.integrity.services import integrity_check_author, integrity_check_experiment
from apps.jobs.services import engine_config, job_succeed, jobs_reap_stale
from workers.runtime import JobTask, RunningJob, job_start, job_task

logger = logging.getLogger(__name__)

DATA_SOFT_LIMIT_SECONDS = 3600


@job_task(TaskName.DATA_JOB, soft_time_limit=DATA_SOFT_LIMIT_SECONDS)
def data_job_task(self: JobTask, *, job_id: int, passes: int = 0) -> None:
    """Run one datapool transform; the new entry is the job's result.

    Spec: ``{"op": filter|deduplicate|mix|convert|decontaminate, "inputs": [entry handle or uuid],
    "params": {...}, "name": optional}`` (see apps.datapool.services.data_transform).
    """
    job = job_start(job_id=job_id, passes=passes)
    if job is None:
        return
    spec = job.spec
    with RunningJob(job) as running:
        running.log(f"data {spec['op']} of {spec['inputs']}")
        entry = data_transform(
            op=spec["op"],
            inputs=[data_entry_get(str(ref)) for ref in spec["inputs"]],
            params=spec.get("params", {}),
            job=job,
            name=spec.get("name"),
        )
        if running.should_stop():
            running.finish_stopped()
            return
        try:
            result = {"entry": str(entry.uuid), "handle": entry.handle, "rows": entry.rows}
            running.record(lambda: job_succeed(job=job, result=result))
        except Conflict:
            logger.warning("job %s ended elsewhere; data entry %s stays registered", job.uuid, entry.handle)


@shared_task(
    name=TaskName.INTEGRITY_CHECK,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=1800,
    time_limit=1860,
)
def integrity_check_task(*, experiment_id: int, reporting_only: bool = False) -> int:
    """Run the checks of one experiment (all twelve, or the reporting three); returns the findings stored.

    Safe to deliver twice: the checks are deterministic and an unchanged finding writes nothing.
    """
    return len(integrity_check_experiment(experiment_id=experiment_id, reporting_only=reporting_only))


@shared_task(
    name=TaskName.INTEGRITY_REPORTS,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=600,
    time_limit=660,
)
def integrity_reports_task(*, run_id: int, author: str) -> int:
    """Judge one author's reports on its node (metric attribution); returns the findings stored.

    Safe to deliver twice: the check is deterministic and an unchanged finding writes nothing.
    """
    return len(integrity_check_author(run_id=run_id, author=author))


@shared_task(name=TaskName.REAP_JOBS, acks_late=False, soft_time_limit=120, time_limit=180)
def reap_jobs_task() -> int:
    """One reaper sweep on demand (every worker also runs the reaper loop; see workers.runtime)."""
    reaped = jobs_reap_stale(stale_after_seconds=engine_config().stale_after_seconds)
    return len(reaped)


ALERT_MAX_RETRIES = 5


class AlertTask(Task):  # type: ignore[type-arg]
    """A delivery whose every retry failed is recorded as failed (STYLE.md 20)."""

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        alert_delivery_fail(delivery_id=kwargs["delivery_id"], error=f"{exc.__class__.__name__}: {exc}")


@shared_task(
    base=AlertTask,
    name=TaskName.ALERT_DELIVER,
    autoretry_for=(AlertTransientError,),
    retry_backoff=2,
    retry_backoff_max=300,
    max_retries=ALERT_MAX_RETRIES,
    acks_late=True,
    soft_time_limit=60,
    time_limit=90,
)
def alert_deliver_task(*, delivery_id: int) -> str:
    """Send one alert (webhook or e-mail); transient failures retry with backoff. Safe to run twice."""
    delivery = alert_deliver(delivery_id=delivery_id)
    return delivery.status if delivery is not None else "missing"
