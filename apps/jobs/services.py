"""The job engine: every training, evaluation and data action is a Job row with a status machine.

The broker only carries "look at job N" (STYLE.md); the row is the truth. Transitions:

    queued  --claim-->  running  --succeed/fail/cancel-->  succeeded | failed | cancelled
    queued  --cancel--> cancelled
    running --reaper--> lost (+ attempt N+1 queued as a new row)
    queued  --reaper--> queued (its message re-sent: no worker claimed it for a while)

Terminal statuses are never left. Every transition writes a JobTransition row and an event on
the run's hash chain in the same transaction. Lock order, whenever several rows are locked: the
job, then its experiment, then the run, then the run's event chain (inside event_append); other
services lock experiment -> chain or run -> chain, so no two can wait on each other in a cycle.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Sum
from django.db.models.functions import Coalesce, Now
from kombu.exceptions import OperationalError

from apps.core.clock import db_now
from apps.core.errors import ApplicationError, Conflict
from apps.core.hashing import sha256_tree
from apps.core.jsonsafe import json_safe
from apps.core.models import clean_new_row
from apps.core.queues import Queue, TaskName
from apps.datapool.storage import artifact_store, checkpoint_key
from apps.experiments.events import event_append
from apps.experiments.models import Experiment
from apps.experiments.services import checkpoint_register, evaluation_record, manifest_digest
from apps.jobs import hooks
from apps.jobs.choices import JOB_TERMINAL_STATES, JobKind, JobStatus
from apps.jobs.models import Job, JobLogLine, JobTransition
from apps.jobs.selectors import job_payload
from apps.jobs.slurm import (
    LIVE_STATES,
    SlurmError,
    executor,
    job_name,
    runs_on_slurm,
    slurm_cancel,
    slurm_config,
    slurm_harvest_output,
    slurm_log,
    slurm_states,
    slurm_submit,
)
from apps.jobs.versions import versions_capture
from apps.live.events import LiveEvent, publish_on_commit
from apps.live.groups import job_group, run_group
from apps.research.models import Run
from rsiweb import env
from rsiweb.celery import app as celery_app

if TYPE_CHECKING:
    from apps.benchmarks.models import Benchmark
    from apps.experiments.models import Checkpoint

logger = logging.getLogger(__name__)

SYSTEM = "system"
DEFAULT_TIME_LIMIT_SECONDS = 3600
MAX_ACCELERATORS = 8  # one host's worth (apps.ml.launch.MAX_DEVICES)
DEFAULT_ACCELERATORS_PER_RUN = 8  # the run policy's default cap (docs/run-policy.md)
# Extra seconds between the soft limit (cooperative stop, clean failure) and the hard kill.
HARD_LIMIT_GRACE_SECONDS = 60
# Loss-curve points kept per job; beyond this the older half is thinned, so rows stay small.
MAX_METRIC_POINTS = 2000


@dataclass(frozen=True)
class EngineConfig:
    """Timing of liveness: a job beats every ``heartbeat_seconds``; silence for ``stale_after_seconds``
    means its worker died. Stale must be several beats long, or a busy database looks like a death.
    A job still queued ``requeue_after_seconds`` after its message was sent has its message re-sent."""

    heartbeat_seconds: float
    stale_after_seconds: float
    reaper_interval_seconds: float
    max_attempts: int
    requeue_after_seconds: float


def engine_config() -> EngineConfig:
    """From settings when the deployment sets them there, else the environment (DESIGN.md)."""

    def number(name: str, default: float) -> float:
        value = getattr(settings, name, None)
        return float(value) if value is not None else env.number(name, default)

    return EngineConfig(
        heartbeat_seconds=number("RSI_JOB_HEARTBEAT_SECONDS", 5.0),
        stale_after_seconds=number("RSI_JOB_STALE_SECONDS", 60.0),
        reaper_interval_seconds=number("RSI_REAPER_INTERVAL_SECONDS", 15.0),
        max_attempts=int(number("RSI_JOB_MAX_ATTEMPTS", 3)),
        requeue_after_seconds=number("RSI_JOB_REQUEUE_SECONDS", 300.0),
    )


# The task that runs each kind of job, and the queue it goes to unless the caller names one.
TASK_NAMES = {
    JobKind.TRAIN: TaskName.TRAIN_JOB,
    JobKind.EVALUATE: TaskName.EVALUATE_JOB,
    JobKind.FINAL_EVAL: TaskName.EVALUATE_JOB,
    JobKind.DATA: TaskName.DATA_JOB,
    JobKind.DOJO_BUILD: TaskName.DOJO_BUILD_JOB,
    JobKind.AGENT_SFT: TaskName.AGENT_SFT_JOB,
}
DEFAULT_QUEUES = {
    JobKind.TRAIN: Queue.GPU,
    JobKind.EVALUATE: Queue.GPU,
    JobKind.FINAL_EVAL: Queue.GPU,
    JobKind.DATA: Queue.DEFAULT,
    JobKind.DOJO_BUILD: Queue.GPU,
    JobKind.AGENT_SFT: Queue.GPU,
}
# Jobs on this queue spend the run's accelerator budget.
ACCELERATOR_QUEUE = Queue.GPU  # (charged by apps.flows.runs.run_charge_job)


def _publish(job: Job, event_type: LiveEvent, payload: dict[str, Any] | None = None) -> None:
    """Tell browsers watching the job (and its run) after commit."""
    body = payload if payload is not None else job_payload(job)
    publish_on_commit(job_group(job.uuid), event_type, body)
    if job.run_id is not None:
        # A run's uuid never changes: the run the job holds (when loaded) gives it without a query.
        if Job.run.is_cached(job):
            run_uuid = job.run.uuid
        else:
            run_uuid = Run.objects.filter(pk=job.run_id).values_list("uuid", flat=True).first()
        publish_on_commit(run_group(run_uuid), event_type, body)


def _record_transition(job: Job, *, from_status: str, reason: str, actor: str) -> None:
    JobTransition.objects.create(job=job, from_status=from_status, to_status=job.status, reason=reason)
    event_append(
        run=job.run,
        type=f"job.{job.status}",
        actor=actor,
        role=SYSTEM,
        arguments={
            "job": str(job.uuid),
            "kind": job.kind,
            "attempt": job.attempt,
            "from": from_status,
            "reason": reason[:2000],
        },
        result_ref=f"job:{job.uuid}",
    )
    _publish(job, LiveEvent.JOB_UPDATED)


def _after_transition(job: Job) -> None:
    # Chaining (train -> evaluate) and experiment status live in the pipeline (apps.flows), which
    # registered itself in apps.jobs.hooks; called inside the same transaction as the job's
    # transition, so a retry never sees one without the other.
    hooks.transitioned(job)


def _lock(job_pk: int) -> Job:
    """Lock a job row and then its experiment's row (see the lock order above)."""
    job = Job.objects.select_for_update(of=("self",)).select_related("run").get(pk=job_pk)
    _lock_experiment(job)
    return job


def _lock_experiment(job: Job) -> None:
    if job.experiment_id is not None:
        list(Experiment.objects.select_for_update().filter(pk=job.experiment_id).values_list("pk", flat=True))


def _send_message(job: Job, *, passes: int = 0) -> None:
    """Put "look at job N" on the job's queue (the same task id every time it is sent), or, for an
    accelerator job under the Slurm executor, submit its batch job unless Slurm holds it already."""
    if runs_on_slurm(job):
        slurm_submit(job)
        return
    celery_app.send_task(
        TASK_NAMES[JobKind(job.kind)],
        kwargs={"job_id": job.pk, **({"passes": passes} if passes else {})},
        queue=job.queue,
        task_id=job.celery_id,
        soft_time_limit=job.time_limit_seconds,
        time_limit=job.time_limit_seconds + HARD_LIMIT_GRACE_SECONDS,
    )


def _send(job: Job) -> None:
    """Send a new job's message. Runs after commit, so the worker finds the row."""
    try:
        _send_message(job)
    except OperationalError as exc:
        # No message means no worker will ever look at the row: fail it visibly, not silently.
        logger.exception("job %s: broker unreachable", job.uuid)
        job_fail(job=job, error=f"could not enqueue: broker unreachable ({exc})")
    except SlurmError as exc:
        # Not failed: the reconciler submits a queued job Slurm does not hold on its next sweep.
        logger.exception("job %s: not submitted to Slurm", job.uuid)
        slurm_log(job, f"slurm: not submitted ({exc.message}); the reaper tries again")


def _create(
    *,
    kind: str,
    spec: dict[str, Any],
    run: Run | None,
    experiment: Experiment | None,
    queue: str,
    seed: int,
    time_limit_seconds: int,
    accelerators: int = 1,
    previous_attempt: Job | None = None,
    reason: str,
) -> Job:
    job = Job(
        kind=kind,
        spec=spec,
        run=run,
        experiment=experiment,
        queue=queue,
        seed=seed,
        time_limit_seconds=time_limit_seconds,
        accelerators=accelerators,
        versions={"enqueued": versions_capture()},
        celery_id=str(uuid.uuid4()),
        attempt=1 if previous_attempt is None else previous_attempt.attempt + 1,
        previous_attempt=previous_attempt,
        published_at=db_now(),
        publishes=1,
    )
    # Its run, experiment and previous attempt are rows the caller read (mostly locked) just now.
    clean_new_row(job, held=("run", "experiment", "previous_attempt"))
    job.save(force_insert=True)
    _record_transition(job, from_status="", reason=reason, actor=SYSTEM)
    # After commit: a worker that got the message before the row is visible would find nothing.
    transaction.on_commit(lambda: _send(job))
    return job


def job_enqueue(
    *,
    kind: str,
    spec: dict[str, Any],
    run: Run | None = None,
    experiment: Experiment | None = None,
    queue: str | None = None,
    seed: int = 0,
    time_limit_seconds: int = DEFAULT_TIME_LIMIT_SECONDS,
    accelerators: int = 1,
) -> Job:
    """Create a queued job (recording package versions and code commit) and send its id to a worker."""
    if kind not in JobKind.values:
        raise ApplicationError("invalid_job_kind", f"Job kind must be one of {JobKind.values}, got {kind!r}.")
    if isinstance(accelerators, bool) or not isinstance(accelerators, int) or not 1 <= accelerators <= MAX_ACCELERATORS:
        raise ApplicationError(
            "invalid_accelerators", f"A job needs 1 to {MAX_ACCELERATORS} accelerators, got {accelerators!r}."
        )
    if time_limit_seconds < 1:
        raise ApplicationError("invalid_time_limit", "A job's time limit must be at least one second.")
    if experiment is not None:
        if run is not None and run.pk != experiment.run_id:
            raise ApplicationError("foreign_experiment", "A job's experiment must belong to the job's run.")
        run = experiment.run
    with transaction.atomic():
        return _create(
            kind=kind,
            spec=spec,
            run=run,
            experiment=experiment,
            queue=queue or DEFAULT_QUEUES[JobKind(kind)],
            seed=seed,
            time_limit_seconds=time_limit_seconds,
            accelerators=accelerators,
            reason="enqueued",
        )


class DevicesBusy(Conflict):
    """The job's devices are not all free on this host now (or are kept for a job waiting longer
    there, or its run holds its cap): it waits queued, holding none."""

    def __init__(self, code: str, message: str, *, may_reserve: bool = False) -> None:
        super().__init__(code, message)
        self.may_reserve = may_reserve  # refused for want of free devices: it may reserve the host


def worker_host(worker: str) -> str:
    """The host part of a worker name (``host:pid``, workers.runtime.worker_name)."""
    return worker.rsplit(":", 1)[0]


def _lock_host(host: str) -> None:
    # One claim at a time per host while devices are counted. PostgreSQL: a transaction-scoped
    # advisory lock; SQLite serialises writers already (the claim's UPDATE comes first there).
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"rsiweb.jobs.host:{host}"])


def _run_cap_refusal(job: Job) -> str | None:
    """Why ``job``'s run may not start it now (its policy's ``accelerators_per_run``), or None.

    Final evaluations are not counted against the cap, so they never wait for the run's trainings.
    """
    if job.run is None or job.kind == JobKind.FINAL_EVAL:
        return None
    cap = int((job.run.policy or {}).get("accelerators_per_run", DEFAULT_ACCELERATORS_PER_RUN))
    in_use = (
        Job.objects.filter(status=JobStatus.RUNNING, run=job.run, queue=job.queue).exclude(pk=job.pk)
        .exclude(kind=JobKind.FINAL_EVAL).aggregate(n=Sum("accelerators"))["n"] or 0
    )  # fmt: skip
    if in_use + job.accelerators > cap:
        return f"The run holds {in_use} of its {cap} accelerators."
    return None


def _reservation(host: str, *, host_devices: int, besides: Job) -> Job | None:
    """The queued job that holds ``host``'s reservation and may still start there, or None.

    A reservation lapses by itself when its job leaves the queue (claimed elsewhere, cancelled):
    only a queued row holds one. It is also void while its job cannot start anyway (its run holds
    its cap, the host is too small): keeping devices idle for it then would only slow everyone else.
    """
    holder = (
        Job.objects.filter(status=JobStatus.QUEUED, reserved_host=host).exclude(pk=besides.pk)
        .select_related("run").first()
    )  # fmt: skip
    if holder is None or holder.accelerators > host_devices or _run_cap_refusal(holder) is not None:
        return None
    return holder


def _ahead_by_fair_share(job: Job, holder: Job) -> bool:
    """Does the fair share between runs (`job_yields_turn`) put ``job`` before ``holder``? It does
    when ``job``'s run holds fewer of the queue's devices than ``holder``'s. Each such start adds
    to its run's count, so this lets another run catch up, never starve the holder."""
    if job.run_id is None or holder.run_id is None or job.run_id == holder.run_id:
        return False
    held = dict(
        Job.objects.filter(queue=job.queue, status=JobStatus.RUNNING, run_id__in=(job.run_id, holder.run_id))
        .values_list("run_id").annotate(n=Sum("accelerators")).values_list("run_id", "n")
    )  # fmt: skip
    mine: int = held.get(job.run_id, 0)
    theirs: int = held.get(holder.run_id, 0)
    return mine < theirs


def _devices_for(job: Job, *, host: str, host_devices: int) -> list[int]:
    """All of ``job``'s devices from those free on ``host``, or DevicesBusy: never a partial hold.

    A job holding some devices while it waits for the rest is how two 4-device jobs deadlock an
    8-device host; a job takes all its devices in one claim or none. The run's policy caps the
    devices its running jobs hold together (``accelerators_per_run``); final evaluations are not
    counted against it, so they never wait for the run's own trainings.

    A multi-device job refused for want of free devices reserves the host (`_reserve_host`): from
    then on the devices that free there are kept for it, and another job (final evaluations
    excepted, and jobs of a run the fair share puts first) may take only those it cannot use, the
    free devices beyond its need. Without the reservation a stream of 1-device jobs would take
    each device as it frees, and an 8-device job would wait forever.
    """
    if (why := _run_cap_refusal(job)) is not None:
        raise DevicesBusy("run_accelerators_cap", why)
    running = Job.objects.filter(status=JobStatus.RUNNING).exclude(pk=job.pk)
    held = {d for devices in running.filter(worker__startswith=f"{host}:").values_list("devices", flat=True)
            for d in devices}  # fmt: skip
    free = [d for d in range(host_devices) if d not in held]
    if len(free) < job.accelerators:
        raise DevicesBusy(
            "devices_busy",
            f"Job {job.uuid} needs {job.accelerators} devices; {len(free)} of {host_devices} are free.",
            may_reserve=True,
        )
    if job.kind != JobKind.FINAL_EVAL and (holder := _reservation(host, host_devices=host_devices, besides=job)):
        spare = len(free) - holder.accelerators
        if job.accelerators > spare and not _ahead_by_fair_share(job, holder):
            raise DevicesBusy(
                "devices_reserved",
                f"Job {job.uuid} needs {job.accelerators} devices; {len(free)} of {host_devices} are free and "
                f"kept for job {holder.uuid}, which waits for {holder.accelerators} on this host.",
            )
    return free[: job.accelerators]


def _reserve_host(job_id: int, *, host: str, host_devices: int) -> Job | None:
    """After a refusal for want of devices: let multi-device job ``job_id`` reserve ``host``.

    One reservation per host and per job (a job keeps the first host it reserved; it still starts
    on any host with room). A host already reserved stays with its holder, except that a final
    evaluation takes it over from any other kind. Returns the job when it now holds the host.
    The caller holds the host's lock, so reservations of one host are decided one at a time.
    """
    job = Job.objects.select_related("run").filter(pk=job_id, status=JobStatus.QUEUED).first()
    if job is None or job.accelerators < 2 or job.accelerators > host_devices or job.reserved_host:
        return None
    holder = _reservation(host, host_devices=host_devices, besides=job)
    if holder is not None and (holder.kind == JobKind.FINAL_EVAL or job.kind != JobKind.FINAL_EVAL):
        return None
    # A lapsed or taken-over reservation is cleared first: one queued holder per host (constraint).
    Job.objects.filter(status=JobStatus.QUEUED, reserved_host=host).update(reserved_host="", updated_at=Now())
    if not Job.objects.filter(pk=job.pk, status=JobStatus.QUEUED).update(reserved_host=host, updated_at=Now()):
        return None
    seq = (JobLogLine.objects.filter(job=job).aggregate(m=Max("seq"))["m"] or 0) + 1
    JobLogLine.objects.create(
        job=job,
        seq=seq,
        text=f"scheduler: reserved host {host}: its devices are kept for this job as they free "
        f"({job.accelerators} of {host_devices} needed)",
    )
    return job


def job_claim(*, job_id: int, worker: str, host_devices: int | None = None) -> Job | None:
    """Move a queued job to running for ``worker``; None when someone else has it (or it ended).

    The conditional UPDATE is the claim: the database lets exactly one of two racing workers
    change ``status=queued`` to running, so a redelivered or duplicated message is harmless.
    With ``host_devices`` (the accelerators on the worker's host) the claim also takes all the
    job's devices there, or raises `DevicesBusy` and leaves the job queued (a multi-device job
    refused for want of devices reserves the host then: `_devices_for`).
    """
    now = Now()  # the database's clock, in the statement: heartbeats and reapers compare with it
    refused: DevicesBusy | None = None
    with transaction.atomic():
        host = worker_host(worker)
        if host_devices is not None:
            _lock_host(host)
        try:
            with transaction.atomic():  # a savepoint: a refusal rolls the claim back, the job stays queued
                claimed = Job.objects.filter(pk=job_id, status=JobStatus.QUEUED).update(
                    status=JobStatus.RUNNING, worker=worker[:200], started_at=now, heartbeat_at=now, updated_at=now,
                    reserved_host="",
                )  # fmt: skip
                if claimed != 1:
                    return None
                job = Job.objects.select_related("run").get(pk=job_id)  # row-locked by the UPDATE above
                if host_devices is not None:
                    job.devices = _devices_for(job, host=host, host_devices=host_devices)
                    job.save(update_fields=["devices", "updated_at"])
        except DevicesBusy as busy:
            refused = busy
            if busy.may_reserve and host_devices is not None:
                _reserve_host(job_id, host=host, host_devices=host_devices)
        if refused is None:
            _lock_experiment(job)
            # The host that runs the job may differ from the one that queued it.
            job.versions = {**job.versions, "executed": versions_capture()}
            job.save(update_fields=["versions", "updated_at"])
            _record_transition(job, from_status=JobStatus.QUEUED, reason=f"claimed by {worker}", actor=worker)
            _after_transition(job)
    if refused is not None:
        raise refused
    return job


@dataclass(frozen=True)
class Beat:
    """What a heartbeat learned: is the job still ours, and has someone asked it to stop?"""

    alive: bool
    cancel_requested: bool


def job_heartbeat(*, job: Job, progress: float | None = None) -> Beat:
    """Mark the job alive (and store its latest progress); tell the worker whether to go on.

    Conditional on the job still running under this worker: a job the reaper has already
    declared lost stays lost, and its zombie worker learns it should stop.
    """
    fields: dict[str, Any] = {"heartbeat_at": Now()}  # the database's clock (apps.core.clock)
    if progress is not None:
        fields["progress"] = min(1.0, max(0.0, float(progress)))
    alive = Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, worker=job.worker).update(**fields) == 1
    cancel = Job.objects.filter(pk=job.pk).values_list("cancel_requested", flat=True).first()
    if alive and progress is not None:
        _publish(job, LiveEvent.JOB_PROGRESS, {"uuid": str(job.uuid), "progress": fields["progress"]})
    return Beat(alive=alive, cancel_requested=bool(cancel))


def job_report(
    *,
    job: Job,
    progress: float | None = None,
    metrics_point: dict[str, Any] | None = None,
    log_line: str | None = None,
    hardware_sample: dict[str, Any] | None = None,
) -> None:
    """Stream progress, a metrics point (loss, tokens/s at a step), a log line and/or a hardware
    sample (apps.jobs.hardware) into the records, and tell the job's watchers (``job.progress``).

    Only the worker that holds the job writes its metrics, so the read-append-write of the JSON
    below has a single writer. Reports for a job that is no longer running (a reaped attempt,
    a late callback) are dropped whole.
    """
    fields: dict[str, Any] = {}
    if progress is not None:
        fields["progress"] = min(1.0, max(0.0, float(progress)))
    if metrics_point is not None:
        metrics_point = json_safe(metrics_point)
        metrics = Job.objects.filter(pk=job.pk).values_list("metrics", flat=True).first() or {}
        points = list(metrics.get("points", []))
        points.append(metrics_point)
        if len(points) > MAX_METRIC_POINTS:
            half = len(points) // 2
            points = points[:half:2] + points[half:]
        last = {**metrics.get("last", {}), **metrics_point}
        fields["metrics"] = {**metrics, "points": points, "last": last}
    if hardware_sample is not None:
        # apps.jobs.hardware: CPU, RAM and per-GPU points, thinned like the loss points.
        metrics = fields.get("metrics") or Job.objects.filter(pk=job.pk).values_list("metrics", flat=True).first() or {}
        samples = [*metrics.get("hardware", []), json_safe(hardware_sample)]
        if len(samples) > MAX_METRIC_POINTS:
            half = len(samples) // 2
            samples = samples[:half:2] + samples[half:]
        fields["metrics"] = {**metrics, "hardware": samples}
    with transaction.atomic():
        running = Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING)
        if fields:
            fields["updated_at"] = db_now()
            if not running.update(**fields):
                return
        elif not running.exists():
            return
        if log_line is not None:
            seq = (JobLogLine.objects.filter(job=job).aggregate(m=Max("seq"))["m"] or 0) + 1
            JobLogLine.objects.create(job=job, seq=seq, text=log_line)
        payload: dict[str, Any] = {"uuid": str(job.uuid)}
        if progress is not None:
            payload["progress"] = fields["progress"]
        if metrics_point is not None:
            payload["metrics_point"] = metrics_point
        if log_line is not None:
            payload["log_line"] = log_line
        if hardware_sample is not None:
            # The job page redraws its hardware chart when one comes (static/dashboard/hardware.js).
            payload["hardware_sample"] = fields["metrics"]["hardware"][-1]
        _publish(job, LiveEvent.JOB_PROGRESS, payload)


def _finish(
    *,
    job: Job,
    to_status: str,
    reason: str,
    actor: str,
    allowed_from: tuple[str, ...] = (JobStatus.RUNNING,),
    result: dict[str, Any] | None = None,
    error: str | None = None,
    chain: bool = True,
) -> Job:
    """Move a job to a terminal status, count its accelerator time, and (``chain``) tell the pipeline."""
    with transaction.atomic():
        # Row lock: the worker finishing, a user cancelling and the reaper may all arrive at once;
        # whoever locks first decides, and the others see a terminal status and are refused.
        locked = _lock(job.pk)
        if locked.status in JOB_TERMINAL_STATES or locked.status not in allowed_from:
            raise Conflict(
                "job_not_running" if locked.status not in JOB_TERMINAL_STATES else "job_finished",
                f"Job {locked.uuid} is {locked.status}; it cannot become {to_status}.",
                status_now=locked.status,
            )
        from_status = locked.status
        if locked.run_id is not None and to_status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
            # The run's row now, in the lock order (job, experiment, run, chain): the run-level
            # health check below reads the run's recent jobs under it.
            Run.objects.select_for_update().filter(pk=locked.run_id).values_list("pk", flat=True).first()
        now = db_now()
        # A lost job stopped at its last heartbeat, not now; its tail is not charged.
        end = locked.heartbeat_at if to_status == JobStatus.LOST and locked.heartbeat_at else now
        # Device-seconds: a job on N accelerators spends N seconds of the budget per second.
        seconds = (
            max(0.0, (end - locked.started_at).total_seconds()) * locked.accelerators if locked.started_at else 0.0
        )
        locked.status = to_status
        locked.finished_at = now
        locked.resource_seconds = seconds
        fields = ["status", "finished_at", "resource_seconds", "updated_at"]
        if result is not None:
            locked.result = json_safe(result)
            fields.append("result")
        if error is not None:
            locked.error = error
            fields.append("error")
        if to_status == JobStatus.SUCCEEDED:
            locked.progress = 1.0
            fields.append("progress")
        locked.save(update_fields=fields)
        # The run's budget is charged the job's accelerator time by the run lifecycle (apps.flows),
        # registered in apps.jobs.hooks: the engine counts seconds, the run decides what they cost.
        hooks.finished(locked)
        _record_transition(locked, from_status=from_status, reason=reason, actor=actor)
        if chain:
            _after_transition(locked)
        if to_status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
            # Run-level health (most recent jobs failing?) is the run lifecycle's (apps.flows),
            # registered in apps.jobs.hooks.
            hooks.ended(locked)
    return locked


def job_succeed(*, job: Job, result: dict[str, Any]) -> Job:
    """A running job finished its work. Raises Conflict when the job already ended (e.g. was reaped)."""
    return _finish(
        job=job, to_status=JobStatus.SUCCEEDED, reason="succeeded", actor=job.worker or SYSTEM, result=result
    )


def job_fail(*, job: Job, error: str) -> Job:
    """A queued or running job failed with ``error`` (a message or traceback). Terminal stays terminal."""
    first_line = (error.strip().splitlines() or ["failed"])[-1][:500]
    return _finish(
        job=job,
        to_status=JobStatus.FAILED,
        reason=first_line,
        actor=job.worker or SYSTEM,
        allowed_from=(JobStatus.QUEUED, JobStatus.RUNNING),
        error=error,
    )


def job_cancel(*, job: Job, reason: str = "cancelled on request") -> Job:
    """The worker honoured a cancel request and stopped: running -> cancelled."""
    return _finish(job=job, to_status=JobStatus.CANCELLED, reason=reason, actor=job.worker or SYSTEM)


def job_request_cancel(*, job: Job, actor: str) -> Job:
    """Ask a job to stop. Queued: cancelled at once. Running: a flag the worker reads cooperatively.

    Idempotent; cancelling a finished job is refused with Conflict.
    """
    with transaction.atomic():
        locked = _lock(job.pk)
        if locked.status == JobStatus.QUEUED:
            locked.cancel_requested = True
            locked.save(update_fields=["cancel_requested", "updated_at"])
            # The queued message stays in the broker; the claim will refuse it (status != queued).
            # A batch job waiting in Slurm's queue is cancelled there too.
            if runs_on_slurm(locked):
                transaction.on_commit(lambda: slurm_cancel(locked))
            return _finish(
                job=locked,
                to_status=JobStatus.CANCELLED,
                reason=f"cancelled by {actor}",
                actor=actor,
                allowed_from=(JobStatus.QUEUED,),
            )
        if locked.status != JobStatus.RUNNING:
            raise Conflict("job_finished", f"Job {locked.uuid} is {locked.status}; there is nothing to cancel.")
        if not locked.cancel_requested:
            locked.cancel_requested = True
            locked.save(update_fields=["cancel_requested", "updated_at"])
            event_append(
                run=locked.run,
                type="job.cancel_requested",
                actor=actor,
                role=SYSTEM,
                arguments={"job": str(locked.uuid)},
                result_ref=f"job:{locked.uuid}",
            )
            _publish(locked, LiveEvent.JOB_UPDATED)
    return locked


def jobs_reap_stale(*, stale_after_seconds: float, max_attempts: int | None = None) -> list[Job]:
    """End running jobs whose heartbeat is older than ``stale_after_seconds``; return them.

    A stale job past its time limit fails; one with a cancel request is cancelled; any other is
    marked lost and, below ``max_attempts``, re-run as attempt N+1 (a new row pointing at the
    old one). ``previous_attempt`` is one-to-one, so two reapers racing can never create two
    retries of one attempt; row locks with SKIP LOCKED let them share the work instead.
    """
    max_attempts = max_attempts or engine_config().max_attempts
    # Stale on the database's clock, which wrote every heartbeat (``Now()`` in the statement):
    # a reaper whose host clock is off by minutes still sees a healthy job as healthy.
    cutoff = Now() - timedelta(seconds=stale_after_seconds)
    now = db_now()
    candidates = list(
        Job.objects.filter(status=JobStatus.RUNNING, heartbeat_at__lt=cutoff).values_list("pk", flat=True)[:100]
    )
    reaped: list[Job] = []
    for pk in candidates:
        with transaction.atomic():
            job = (
                Job.objects.select_for_update(skip_locked=True)
                .filter(pk=pk, status=JobStatus.RUNNING, heartbeat_at__lt=cutoff)
                .first()
            )
            if job is None:
                continue  # finished, beat again, or another reaper holds it
            _lock_experiment(job)
            overdue = job.started_at is not None and (now - job.started_at).total_seconds() > (
                job.time_limit_seconds + HARD_LIMIT_GRACE_SECONDS
            )
            if overdue:
                reaped.append(
                    _finish(
                        job=job,
                        to_status=JobStatus.FAILED,
                        reason="time limit exceeded",
                        actor="reaper",
                        error=f"time limit of {job.time_limit_seconds}s exceeded; the worker was stopped",
                    )
                )
                continue
            if job.cancel_requested:
                reaped.append(
                    _finish(job=job, to_status=JobStatus.CANCELLED, reason="cancelled; worker gone", actor="reaper")
                )
                continue
            silent = (now - job.heartbeat_at).total_seconds() if job.heartbeat_at else stale_after_seconds
            reason = f"no heartbeat from {job.worker or 'its worker'} for {silent:.0f}s"
            reaped.append(_lose(job, reason=reason, actor="reaper", max_attempts=max_attempts))
    return reaped


def _lose(job: Job, *, reason: str, actor: str, max_attempts: int) -> Job:
    """Running -> lost, and attempt N+1 queued below ``max_attempts``. The caller holds the job's lock."""
    lost = _finish(job=job, to_status=JobStatus.LOST, actor=actor, chain=False, reason=reason)
    if lost.attempt < max_attempts:
        _create(
            kind=lost.kind,
            spec=lost.spec,
            run=lost.run,
            experiment=lost.experiment,
            queue=lost.queue,
            seed=lost.seed,
            time_limit_seconds=lost.time_limit_seconds,
            previous_attempt=lost,
            reason=f"attempt {lost.attempt + 1} after attempt {lost.attempt} was lost",
        )
    # Only now, with attempt N+1 in place or not, can the pipeline tell "retrying" from "given up"
    # for the experiment.
    _after_transition(lost)
    return lost


def job_give_up(*, job: Job, reason: str) -> Job:
    """The worker running ``job`` stopped it because it could not reach the records for longer than
    the stale threshold: the attempt is lost and retried, exactly as the reaper would have done.

    Recorded by the worker once the database answers again, with its own reason; Conflict when
    the job is no longer this attempt's (the reaper, or a cancel, got there first).
    """
    with transaction.atomic():
        locked = _lock_own_running(job, what="its loss")
        return _lose(locked, reason=reason, actor=job.worker or SYSTEM, max_attempts=engine_config().max_attempts)


def job_yields_turn(*, job: Job) -> bool:
    """Should a worker with a free slot pass over ``job`` for another run's? The slots' fair share.

    A queue's messages are first in, first out, so a run that submits many jobs at once would
    hold every slot while runs that submitted a moment later wait (concurrent runs of an agent
    suite or an ablation then compare scheduling luck, not agents). A run's job yields when
    another run has a job queued on the same queue and fewer jobs running there than this one:
    max-min fairness over runs, one slot at a time (counted in devices: a 4-device job holds 4
    slots). A run with nothing running never yields, so
    every run with work gets a slot; final evaluations and jobs of no run never yield.
    """
    if job.run_id is None or job.kind == JobKind.FINAL_EVAL:
        return False
    running = dict(
        Job.objects.filter(queue=job.queue, status=JobStatus.RUNNING, run__isnull=False)
        .values_list("run_id")
        .annotate(n=Sum("accelerators"))
        .values_list("run_id", "n")
    )
    mine = running.get(job.run_id, 0)
    if mine == 0:
        return False
    waiting = (
        Job.objects.filter(queue=job.queue, status=JobStatus.QUEUED, run__isnull=False)
        .exclude(run_id=job.run_id)
        .values_list("run_id", flat=True)
        .distinct()
    )
    return any(running.get(run_id, 0) < mine for run_id in waiting)


def job_pass_turn(*, job: Job, passes: int) -> None:
    """Send ``job``'s message again, to the back of its queue, without claiming it (it stays queued).

    The message carries ``passes`` (how often it passed its turn). Its send time is renewed, so
    the reaper does not take it for a lost message.
    """
    Job.objects.filter(pk=job.pk, status=JobStatus.QUEUED).update(published_at=db_now())
    _resend(job, passes=passes)


# A job that only waits its turn (behind hours of training on the one accelerator) is re-sent
# too, harmlessly; so the wait doubles after each re-send, up to 2**this times the threshold.
MAX_REQUEUE_DOUBLINGS = 6


def _resend(job: Job, *, passes: int = 0) -> None:
    try:
        _send_message(job, passes=passes)
    except (OperationalError, SlurmError):
        # Unlike a first send, not a reason to fail the job: the row still says queued, and the
        # next sweep after the back-off tries again.
        logger.warning("job %s: broker unreachable; re-send %s not delivered", job.uuid, job.publishes, exc_info=True)


def jobs_republish_unclaimed(*, queued_after_seconds: float) -> list[Job]:
    """Re-send the message of queued jobs that no worker claimed for a while; return those jobs.

    The broker can lose a message a queued row still waits for: a worker that prefetched it and
    died before its claim (acks late: Redis gives it back only after its visibility timeout,
    hours away), a purged or flushed queue, a broker restarted without persistence (that one is
    noticed at once: ``jobs_resend_missing``). The message sent again is the same (job id, task
    id); the first copy a worker takes claims the job with the conditional UPDATE, and every
    other copy finds it no longer queued, so the job runs once. A job is re-sent when
    ``queued_after_seconds`` × 2**(re-sends so far) passed since its last send; each re-send is
    recorded as a ``job.republished`` event and a line in the job's log.
    """
    now = db_now()
    cutoff = now - timedelta(seconds=queued_after_seconds)
    queued = Job.objects.filter(status=JobStatus.QUEUED)
    if executor() == "slurm":
        # A batch job may wait in Slurm's queue for hours; jobs_reconcile_slurm asks Slurm instead.
        queued = queued.exclude(queue=Queue.GPU)
    candidates = list(
        queued.annotate(sent_at=Coalesce("published_at", "created_at"))
        .filter(sent_at__lt=cutoff)
        .order_by("sent_at")  # longest unanswered first, so jobs backing off cannot crowd them out
        .values_list("pk", flat=True)[:100]
    )

    def due(job: Job) -> str | None:
        waited = (now - (job.published_at or job.created_at)).total_seconds()
        resends = max(job.publishes - 1, 0)
        if waited < queued_after_seconds * 2 ** min(resends, MAX_REQUEUE_DOUBLINGS):
            return None  # backing off
        return f"not claimed {waited:.0f}s after its message was sent; sent again to queue {job.queue}"

    return [job for pk in candidates if (job := _republish(pk, why=due)) is not None]


# A job created (or re-sent) this recently may have its message still on the way to the broker
# (it is sent after the commit): not taken for lost when the broker does not hold it yet.
RESEND_GRACE_SECONDS = 2.0


def jobs_resend_missing(*, on_broker: set[str], queues: tuple[str, ...]) -> list[Job]:
    """Re-send now the message of every queued job of ``queues`` that the broker does not hold.

    ``on_broker``: the task ids of the messages the broker holds (waiting in a queue or taken by
    a worker and not yet acknowledged), read just before. Called when the broker came back from a
    restart (workers.runtime): one restarted without persistence lost every queued message, and
    the database's record of what is queued is what is sent again, at once, instead of after
    ``RSI_JOB_REQUEUE_SECONDS``. A copy next to a message that survived runs once (the claim).
    The grace is measured on the database's clock, as every send time is.
    """
    candidates = list(
        Job.objects.filter(status=JobStatus.QUEUED, queue__in=queues)
        .annotate(sent_at=Coalesce("published_at", "created_at"))
        .filter(sent_at__lt=Now() - timedelta(seconds=RESEND_GRACE_SECONDS))
        .exclude(celery_id__in=on_broker)
        .order_by("sent_at")
        .values_list("pk", flat=True)
    )

    def lost(job: Job) -> str:
        return f"its message was not on the broker after the broker restarted; sent again to queue {job.queue}"

    return [job for pk in candidates if (job := _republish(pk, why=lost)) is not None]


def _republish(pk: int, *, why: Callable[[Job], str | None]) -> Job | None:
    """Send queued job ``pk``'s message again when ``why(job)`` gives a reason (None: not now).

    Recorded as a ``job.republished`` event and a line in the job's log, and counted in
    ``publishes``; the send itself follows the commit. None when the job is no longer queued,
    another sweep holds it, or ``why`` declined.
    """
    with transaction.atomic():
        # The claim's UPDATE and this lock serialise: a job claimed meanwhile is skipped here.
        job = (
            Job.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("run")
            .filter(pk=pk, status=JobStatus.QUEUED)
            .first()
        )
        if job is None:
            return None
        reason = why(job)
        if reason is None:
            return None
        Job.objects.filter(pk=job.pk).update(published_at=Now(), publishes=max(job.publishes, 1) + 1,
                                             updated_at=Now())  # fmt: skip
        job.refresh_from_db(fields=["published_at", "publishes", "updated_at"])
        event_append(
            run=job.run,
            type="job.republished",
            actor="reaper",
            role=SYSTEM,
            arguments={
                "job": str(job.uuid),
                "kind": job.kind,
                "attempt": job.attempt,
                "publishes": job.publishes,
                "reason": reason,
            },
            result_ref=f"job:{job.uuid}",
        )
        seq = (JobLogLine.objects.filter(job=job).aggregate(m=Max("seq"))["m"] or 0) + 1
        JobLogLine.objects.create(job=job, seq=seq, text=f"reaper: {reason}")
        transaction.on_commit(lambda: _resend(job))
    return job


@dataclass
class Reconciled:
    """What one Slurm sweep did: rows submitted again, rows ended, leftover batch jobs cancelled."""

    resubmitted: list[Job] = field(default_factory=list)
    ended: list[Job] = field(default_factory=list)
    cancelled: list[Job] = field(default_factory=list)


# A row that ended this recently may still have its batch job finishing (writing its output).
LEFTOVER_GRACE_SECONDS = 60.0


def jobs_reconcile_slurm(*, max_attempts: int | None = None, max_submits: int | None = None) -> Reconciled:
    """Bring the accelerator job rows and Slurm's queue into agreement (apps.jobs.slurm); idempotent.

    Slurm's answer is read first, then each row under its lock: a row still active after Slurm
    said its batch job ended really lost it. A queued row whose batch job is gone is submitted
    again (``job.republished``), up to ``max_submits`` submissions, then failed; a running row
    whose batch job ended is lost (attempt N+1 below ``max_attempts``) or, after Slurm's time
    limit, failed; a batch job still alive for a row that ended is cancelled.
    """
    max_attempts = max_attempts or engine_config().max_attempts
    max_submits = max_submits or slurm_config().max_submits
    states = slurm_states()
    done = Reconciled()
    for job in Job.objects.filter(queue=Queue.GPU, status__in=(JobStatus.QUEUED, JobStatus.RUNNING)):
        held = states.get(job_name(job))
        if held is not None and held[1] in LIVE_STATES:
            continue
        state = f"batch job {held[0]} {held[1]}" if held else "no batch job Slurm knows"
        if job.status == JobStatus.QUEUED and job.publishes < max_submits:

            def why(row: Job, state: str = state) -> str | None:
                return f"Slurm has {state} for it; submitted again"

            if (again := _republish(job.pk, why=why)) is not None:
                done.resubmitted.append(again)
            continue
        with transaction.atomic():
            locked = (
                Job.objects.select_for_update(skip_locked=True)
                .filter(pk=job.pk, status__in=(JobStatus.QUEUED, JobStatus.RUNNING))
                .first()
            )
            if locked is None:
                continue  # it recorded its own end meanwhile, or another sweep holds it
            _lock_experiment(locked)
            if locked.status == JobStatus.QUEUED:
                ended = _finish(
                    job=locked,
                    to_status=JobStatus.FAILED,
                    actor="reaper",
                    allowed_from=(JobStatus.QUEUED,),
                    reason=f"submitted {locked.publishes} times, never claimed",
                    error=f"Slurm ran it {locked.publishes} times and it never started ({state})",
                )
            elif held is not None and held[1] == "TIMEOUT":
                ended = _finish(
                    job=locked,
                    to_status=JobStatus.FAILED,
                    actor="reaper",
                    reason="time limit exceeded",
                    error=f"Slurm's time limit ended {state}",
                )
            else:
                ended = _lose(locked, reason=f"{state} while it ran", actor="reaper", max_attempts=max_attempts)
        slurm_harvest_output(ended, state=held[1] if held else "unknown to Slurm")
        done.ended.append(ended)
    alive = {name for name, (_, slurm_state) in states.items() if slurm_state in LIVE_STATES}
    if alive:
        now = db_now()
        leftovers = Job.objects.filter(
            queue=Queue.GPU,
            status__in=JOB_TERMINAL_STATES,
            finished_at__lt=now - timedelta(seconds=LEFTOVER_GRACE_SECONDS),
            finished_at__gte=now - timedelta(days=1),
        )
        for job in leftovers:
            if job_name(job) in alive:
                slurm_cancel(job)
                done.cancelled.append(job)
    return done


# --- job outputs: recorded together with the success, under the job's lock ----------------------


def checkpoint_dir_for(job: Job) -> Path:
    """Local scratch folder a training attempt writes its checkpoint to (one per attempt uuid).

    The finished checkpoint then moves into the artifact store (a folder or an fsspec URL) under
    its manifest digest, so workers on any host write the same way.
    """
    return scratch_root() / str(job.uuid)


def scratch_root() -> Path:
    return Path(settings.DATA_DIR) / "work" / "checkpoints"


def job_succeed_with_checkpoint(*, job: Job, checkpoint_dir: Path, parent: Checkpoint, result: dict[str, Any]) -> Job:
    """Store the trained checkpoint, register it (sha256 manifest, parent θ_in) and succeed.

    Registration happens only while this attempt still holds the job: an attempt the reaper
    declared lost gets Conflict and registers nothing, and the unique ``producing_job`` backs
    that up, so each job has at most one output checkpoint. The stored copy is content-addressed
    (key = manifest digest), so a copy made by such a zombie attempt is at worst an unreferenced
    duplicate of bytes, never a second checkpoint.
    """
    manifest = sha256_tree(checkpoint_dir)
    if not manifest:
        raise ApplicationError("empty_checkpoint", f"training wrote no files to {checkpoint_dir}")
    uri = artifact_store().put_dir(checkpoint_dir, key=checkpoint_key(manifest_digest(manifest)))
    with transaction.atomic():
        locked = _lock_own_running(job, what="its output checkpoint")
        checkpoint = checkpoint_register(
            uri=uri, manifest=manifest, parent=parent, producing_job=locked, run=locked.run
        )
        return job_succeed(
            job=locked,
            result={**result, "checkpoint": str(checkpoint.uuid), "checkpoint_handle": checkpoint.handle},
        )


def _lock_own_running(job: Job, *, what: str) -> Job:
    """Lock the job, refusing (Conflict) unless it is still running under this attempt's worker.

    An attempt the reaper declared lost, or a job cancelled meanwhile, must not record an output.
    """
    locked = _lock(job.pk)
    if locked.status != JobStatus.RUNNING or locked.worker != job.worker:
        raise Conflict("job_not_running", f"Job {locked.uuid} is {locked.status}; {what} is not recorded.")
    return locked


def job_succeed_with_evaluation(
    *,
    job: Job,
    checkpoint: Checkpoint,
    benchmark: Benchmark,
    split: str,
    rows: list[dict[str, Any]],
    backend: str,
    seal: dict[str, Any],
    inference: dict[str, Any] | None = None,
) -> Job:
    """Record the evaluation (aggregate + sealed per-sample rows) with the hashes it verified, and succeed.

    ``seal`` is what benchmark_load_sealed verified just before the run; those are the hashes recorded.
    ``inference`` is what ran it (engine, weight provenance, seeds and their mean; Evaluation.inference).
    """
    with transaction.atomic():
        locked = _lock_own_running(job, what="its result")
        evaluation = evaluation_record(
            job=locked,
            checkpoint=checkpoint,
            benchmark=benchmark,
            split=split,
            rows=rows,
            seal=seal,
            backend=backend,
            inference=inference,
        )
        return job_succeed(
            job=locked,
            result={
                "evaluation": str(evaluation.uuid),
                "score": evaluation.score,
                "correct": evaluation.correct,
                "samples": evaluation.sample_count,
            },
        )


def job_refuse_evaluation(*, job: Job, checkpoint: Checkpoint, benchmark: Benchmark, split: str, reason: str) -> Job:
    """The sealed hashes did not verify: record a refused evaluation (nothing was run) and fail the job."""
    with transaction.atomic():
        locked = _lock_own_running(job, what="the refusal")
        evaluation_record(job=locked, checkpoint=checkpoint, benchmark=benchmark, split=split, refusal_reason=reason)
        return job_fail(job=locked, error=f"evaluation refused: {reason}")
