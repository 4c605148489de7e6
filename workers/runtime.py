"""What every job task shares: the claim, a heartbeat thread, cooperative stop, failure to the row,
and the reaper loop that each worker process runs.

Kept apart from the task modules so that `workers.gpu.tasks` and `workers.data.tasks` stay a
list of thin tasks (STYLE.md 18), and free of torch so the data and agent workers stay light.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from celery import Task, shared_task, signals
from celery.exceptions import SoftTimeLimitExceeded
from django.db import DatabaseError, close_old_connections, connection

from apps.benchmarks.services import checkpoint_local_dir
from apps.core.errors import Conflict
from apps.core.hashing import sha256_file, sha256_tree
from apps.core.queues import Queue
from apps.core.transient import DB_TRANSIENT_ERRORS
from apps.datapool.storage import artifact_store
from apps.jobs.choices import JOB_ACTIVE_STATES, JobStatus
from apps.jobs.hardware import Sampler, sample_seconds
from apps.jobs.models import Job
from apps.jobs.selectors import job_get
from apps.jobs.services import (
    HARD_LIMIT_GRACE_SECONDS,
    DevicesBusy,
    engine_config,
    job_cancel,
    job_claim,
    job_fail,
    job_give_up,
    job_heartbeat,
    job_pass_turn,
    job_report,
    job_yields_turn,
    jobs_reap_stale,
    jobs_reconcile_slurm,
    jobs_republish_unclaimed,
    jobs_resend_missing,
    scratch_root,
)
from apps.jobs.slurm import SlurmError, executor
from apps.research.agent_loops import agent_messages_republish
from rsiweb.celery import broker_server_id, broker_snapshot

logger = logging.getLogger(__name__)

T = TypeVar("T")
# Reports queued while the database is away: a 60 s outage at a few lines a second fits many
# times over; beyond it new ones are dropped (the job stops at the stale threshold anyway).
MAX_PENDING_REPORTS = 10_000
# A message that passes its turn (fair share between runs) is sent again after this pause.
PASS_TURN_PAUSE_SECONDS = float(os.environ.get("RSI_PASS_TURN_PAUSE_SECONDS", "0.5"))
MAX_PASSES = 20


def worker_name() -> str:
    """Who holds a job: host and process id (unique while the process lives)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class JobTask(Task):  # type: ignore[misc]
    """Base of job tasks: an exception that escapes the task body fails the job with its traceback.

    Only a job this process holds is failed: a task that crashed before its claim must not fail
    a job another worker is running.
    """

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        try:
            job = job_get(job_id=(kwargs or {}).get("job_id", -1))
            if job is None or job.status != JobStatus.RUNNING or job.worker != worker_name():
                return
            timed_out = isinstance(exc, SoftTimeLimitExceeded)
            summary = "time limit exceeded" if timed_out else f"{type(exc).__name__}: {exc}"
            job_fail(job=job, error=f"{einfo.traceback}\n{summary}")
        except Conflict:
            logger.info("job %s ended before its failure could be recorded", kwargs)
        except DB_TRANSIENT_ERRORS:
            # The database is away: the job's heartbeat goes stale, and a reaper records it lost
            # (and retries it) once the database answers.
            logger.warning("job %s: failure not recorded, database unavailable; left to the reaper", kwargs)


def job_task(name: str, *, soft_time_limit: int) -> Callable[[Callable[..., Any]], Any]:
    """The decorator of every job task: bound, a JobTask, acknowledged late and requeued when its
    worker is lost, with Celery's soft limit and the hard kill ``HARD_LIMIT_GRACE_SECONDS`` later.

    These are the backstop: per job, the enqueue passes the job's own limits, and RunningJob also
    stops the runner cooperatively.
    """
    return shared_task(
        bind=True,
        base=JobTask,
        name=name,
        acks_late=True,
        reject_on_worker_lost=True,
        soft_time_limit=soft_time_limit,
        time_limit=soft_time_limit + HARD_LIMIT_GRACE_SECONDS,
    )


def host_devices(job: Job) -> int | None:
    """The accelerators of this worker's host (``RSI_HOST_DEVICES``) for a job of the accelerator queue.

    Unset (the embedded default), device accounting is off: the worker's Celery concurrency is
    the only bound, as before multi-device jobs.
    """
    if job.queue != Queue.GPU:
        return None
    configured = os.environ.get("RSI_HOST_DEVICES")
    return int(configured) if configured else None


def job_start(*, job_id: int, passes: int = 0) -> Job | None:
    """Fetch and claim the job a message points at; None (logged) when there is nothing to run.

    ``passes``: how often this message already passed its turn to another run (fair share); past
    ``MAX_PASSES`` the job runs regardless, so a waiting job whose message was lost (the reaper
    re-sends it only minutes later) cannot keep a free slot cycling.
    """
    job = job_get(job_id=job_id)
    if job is None:
        logger.warning("job %s does not exist; message dropped", job_id)
        return None
    if job.status == JobStatus.QUEUED and passes < MAX_PASSES and job_yields_turn(job=job):
        # Another run waits with fewer jobs running: its message is further back in the queue.
        # A pause first, so a queue holding only yielding messages is not a busy loop.
        time.sleep(PASS_TURN_PAUSE_SECONDS)
        job_pass_turn(job=job, passes=passes + 1)
        logger.info("job %s passes its turn to a run with fewer jobs running", job.uuid)
        return None
    try:
        claimed = job_claim(job_id=job_id, worker=worker_name(), host_devices=host_devices(job))
    except DevicesBusy as exc:
        # Not all its devices are free on this host (or its run holds its cap): it waits queued,
        # holding none, and its message goes to the back of the queue.
        time.sleep(PASS_TURN_PAUSE_SECONDS)
        job_pass_turn(job=job, passes=passes)
        logger.info("job %s waits: %s", job.uuid, exc)
        return None
    if claimed is None:
        # A redelivered message, a duplicate, or a job cancelled while queued: nothing to do.
        logger.info("job %s is %s, not queued; another worker has or had it", job.uuid, job.status)
    return claimed


class RunningJob:
    """Keeps a claimed job alive while its body runs, and tells the body when to stop.

    A background thread beats every ``heartbeat_seconds`` (carrying the latest progress) and
    reads the cancel flag, so ``should_stop()`` is a memory read the trainer can call every step.
    It says stop on a cancel request, when the job is no longer ours (the reaper declared it
    lost), at the job's time limit (a cooperative limit that also works in the solo pool), and
    when the database has been out of reach for longer than the stale threshold.

    Progress, metrics and log lines ride out a short database outage (a restart): reports queue
    here in order and go out as soon as a write succeeds again, from the body or the heartbeat.
    A job that cannot report for longer than ``stale_after_seconds`` stops: by then the reaper
    would declare it lost anyway, so it frees the accelerator and, once the database answers,
    records itself lost, which queues attempt N+1 (``job_give_up``).
    """

    def __init__(self, job: Job) -> None:
        config = engine_config()
        self.job = job
        self.interval = config.heartbeat_seconds
        self.stale_after = config.stale_after_seconds
        self.started = time.monotonic()
        self.deadline = self.started + job.time_limit_seconds
        self._progress: float | None = None
        self._done = threading.Event()
        self._cancel = threading.Event()
        self._lost = threading.Event()
        self._unreachable = threading.Event()
        # Reports not yet written, oldest first. One writer at a time (job_report's read-append-
        # write of the metrics JSON needs it), whichever thread flushes.
        self._pending: deque[dict[str, Any]] = deque()
        self._report_lock = threading.Lock()
        self._contact = time.monotonic()  # when the database last took a beat or a report
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{job.pk}", daemon=True)
        self._sampler = Sampler(devices=job.devices)
        self._sample_every = sample_seconds()
        self._sampling = threading.Thread(target=self._sample, name=f"hardware-{job.pk}", daemon=True)

    def __enter__(self) -> RunningJob:
        self._thread.start()
        self._report(hardware_sample=self._sampler.sample())
        self._sampling.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=30)
        self._sampling.join(timeout=30)
        self._report(hardware_sample=self._sampler.sample())  # the last point, however short the job
        self.flush()

    def _sample(self) -> None:
        # Hardware evidence (apps.jobs.hardware): every RSI_HARDWARE_SAMPLE_SECONDS, through the
        # same ordered report queue as metrics, so one writer appends to the job's metrics JSON.
        try:
            while not self._done.wait(self._sample_every):
                self._report(hardware_sample=self._sampler.sample())
        finally:
            connection.close()  # this thread's own connection

    def _beat(self) -> None:
        try:
            while not self._done.wait(self.interval):
                try:
                    beat = job_heartbeat(job=self.job, progress=self._progress)
                except DatabaseError:
                    # One missed beat is not a death: the reaper waits several intervals.
                    logger.warning("job %s: heartbeat failed", self.job.uuid, exc_info=True)
                    close_old_connections()
                    self._note_silence()
                    continue
                self._touch()
                if beat.cancel_requested:
                    self._cancel.set()
                if not beat.alive:
                    self._lost.set()
                self.flush(wait=False)  # a backlog from an outage drains even while the body is silent
        finally:
            connection.close()  # this thread's own connection

    def _touch(self) -> None:
        self._contact = time.monotonic()

    def _note_silence(self) -> None:
        silent = time.monotonic() - self._contact
        if silent > self.stale_after and not self._unreachable.is_set():
            logger.error("job %s: no report reached the database for %.0fs; stopping", self.job.uuid, silent)
            self._unreachable.set()

    # --- hooks for the runner ---------------------------------------------------------------

    def should_stop(self) -> bool:
        return (
            self._cancel.is_set()
            or self._lost.is_set()
            or self._unreachable.is_set()
            or time.monotonic() > self.deadline
        )

    def on_progress(self, fraction: float) -> None:
        self._progress = fraction  # written to the row by the next heartbeat

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        # elapsed_s: seconds since the job began, for the curves' time axis (not a metric of its own).
        point = {"step": step, **{k: round(v, 6) for k, v in metrics.items()}}
        point["elapsed_s"] = round(time.monotonic() - self.started, 3)
        text = " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        self._report(metrics_point=point, log_line=f"step {step}: {text}")

    def log(self, text: str) -> None:
        self._report(log_line=text)

    def _report(self, **report: Any) -> None:
        if len(self._pending) >= MAX_PENDING_REPORTS:
            return  # the newest goes: the queue keeps the order of what it has
        self._pending.append(report)
        # Not waiting: if the heartbeat thread is flushing, it writes this report too.
        self.flush(wait=False)

    def flush(self, *, wait: bool = True) -> bool:
        """Write the queued reports in order; False (they stay queued) while the database is away."""
        if not self._report_lock.acquire(blocking=wait):
            return False
        try:
            while self._pending:
                try:
                    job_report(job=self.job, **self._pending[0])
                except DB_TRANSIENT_ERRORS:
                    logger.warning("job %s: %d report(s) wait for the database", self.job.uuid, len(self._pending))
                    close_old_connections()
                    self._note_silence()
                    return False
                self._pending.popleft()
                self._touch()
        finally:
            self._report_lock.release()
        return True

    def record(self, write: Callable[[], T]) -> T:
        """Run the job's final write (its result), waiting out a database outage shorter than the
        stale threshold; past it the error propagates and the reaper retries the job.

        The queued reports go first: once the result is written the job is no longer running and
        a report would be dropped, so loss lines logged during an outage that outlasted the body
        would be lost (CI: a 400-step training ended inside a 20 s outage, steps 260-400 gone).
        """
        self._report(hardware_sample=self._sampler.sample())  # the last point before the job ends
        while not self.flush() and time.monotonic() - self._contact <= self.stale_after:
            logger.warning("job %s: the database is away; its reports and result wait", self.job.uuid)
            time.sleep(self.interval)
        while True:
            try:
                value = write()
            except DB_TRANSIENT_ERRORS:
                close_old_connections()
                if time.monotonic() - self._contact > self.stale_after:
                    raise
                logger.warning("job %s: the database is away; its result waits", self.job.uuid)
                time.sleep(self.interval)
                continue
            self._touch()
            return value

    # --- ending after should_stop() ------------------------------------------------------------

    def finish_stopped(self) -> None:
        """Record why the body stopped early: cancelled, over time, unreachable, or (lost) nothing."""
        if self._lost.is_set():
            logger.info("job %s was taken from this worker (reaped); stopping without a result", self.job.uuid)
            return
        if self._unreachable.is_set():
            self._give_up()
            return
        try:
            if self._cancel.is_set():
                job_cancel(job=self.job)
            else:
                job_fail(job=self.job, error=f"time limit of {self.job.time_limit_seconds}s exceeded")
        except Conflict:
            logger.info("job %s ended elsewhere while stopping", self.job.uuid)

    def _give_up(self) -> None:
        """Record this attempt lost (attempt N+1 follows) once the database answers again.

        Waits at most another stale period: if the database is still away, the reaper of
        whichever worker sees it first records the loss instead (the heartbeat is stale by then).
        """
        reason = f"stopped: could not report to the database for over {self.stale_after:.0f}s"
        give_up_by = time.monotonic() + self.stale_after
        while True:
            try:
                job_give_up(job=self.job, reason=reason)
            except Conflict:
                logger.info("job %s ended elsewhere (reaped) while this worker waited to give it up", self.job.uuid)
            except DB_TRANSIENT_ERRORS:
                close_old_connections()
                if time.monotonic() < give_up_by:
                    time.sleep(self.interval)
                    continue
                logger.warning("job %s: the database is still away; the reaper will retry the job", self.job.uuid)
            return


# --- artifacts ----------------------------------------------------------------------------------


class IntegrityError(RuntimeError):
    """A file a job is about to use is not the one that was registered (its sha256 differs)."""


def checkpoint_verified_dir(checkpoint: Any) -> Path:
    """The checkpoint's local directory, after checking every file against its sha256 manifest.

    Training or evaluating other weights than the registered ones would break the lineage the
    integrity checks rely on, so a mismatch stops the job. Checkpoints come from the artifact
    store (materialised locally when it is remote) or, for sealed references, the sealed folder.
    """
    directory = checkpoint_local_dir(checkpoint=checkpoint)
    if not directory.is_dir():
        raise IntegrityError(f"checkpoint {checkpoint.handle}: directory {directory} is missing")
    actual = sha256_tree(directory)
    if actual != checkpoint.manifest:
        changed = sorted(set(actual.items()) ^ set(checkpoint.manifest.items()))
        names = sorted({name for name, _ in changed})[:5]
        raise IntegrityError(f"checkpoint {checkpoint.handle}: files differ from its manifest: {names}")
    return directory


def data_verified_file(item: dict[str, Any]) -> Path:
    """A datapool file named in a job spec, after checking its sha256 against the pinned one."""
    path = artifact_store().local_path(item["uri"])
    if not path.is_file():
        raise IntegrityError(f"datapool entry {item.get('handle', item['uri'])}: file {path} is missing")
    if sha256_file(path) != item["sha256"]:
        raise IntegrityError(
            f"datapool entry {item.get('handle', item['uri'])}: file content changed since registration"
        )
    return path


def scratch_sweep() -> int:
    """Remove this host's training scratch of jobs that are over; return how many folders went.

    A SIGKILLed attempt never runs its clean-up, so its half-written checkpoint stays on the
    local disk; the folders are named by job uuid, and only those of queued or running jobs stay.
    """
    root = scratch_root()
    if not root.is_dir():
        return 0
    owners: dict[Path, str] = {}
    for path in root.iterdir():
        name = path.name.lstrip(".").split(".partial", 1)[0]
        try:
            owners[path] = str(uuid.UUID(name))
        except ValueError:
            continue
    active = {
        str(u)
        for u in Job.objects.filter(uuid__in=set(owners.values()), status__in=JOB_ACTIVE_STATES).values_list(
            "uuid", flat=True
        )
    }
    removed = 0
    for path, owner in owners.items():
        if owner not in active:
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


# --- the reaper ---------------------------------------------------------------------------------
#
# Every worker process runs the reaper in a thread rather than relying on a Celery beat
# process: beat is one more process to deploy and, when it is down, nobody reaps. Workers are
# exactly the processes that exist whenever a lost job could be re-run, and reapers racing each
# other are safe (SKIP LOCKED rows, one-to-one previous_attempt). Each sweep ends running jobs
# whose heartbeat went stale, and re-sends the message of queued jobs no worker has claimed
# (a message lost in the broker would otherwise leave the row queued for good), and of agent
# steps and run-supervisor ticks the broker lost (apps.research.agent_loops).

_reaper_stop = threading.Event()


class BrokerWatch:
    """Notices the broker coming back from a restart, and re-sends what the restart lost.

    Each sweep reads the broker's identity (Redis's run id, one round trip); when it differs from
    the last one this process saw, every queued job whose message the broker does not hold is
    sent again at once (``jobs_resend_missing``), instead of after ``RSI_JOB_REQUEUE_SECONDS``:
    a Redis restarted without persistence comes back empty, and the accelerators would idle for
    minutes (issue 35). A broker that kept its messages (AOF) holds them all, and nothing is sent
    twice. The comparison is repeated on the next ``RECHECKS`` sweeps: a job queued a moment
    before the restart is spared by the first (its message may still be on the way) but not by
    the later ones.
    """

    RECHECKS = 3

    def __init__(self) -> None:
        self.server: str | None = None
        self.rechecks = 0

    def sweep(self) -> list[Job]:
        try:
            server = broker_server_id()
            if server is None:
                return []
            if self.server is None:
                # The first broker this process sees: what it lost before is the business of the
                # processes that were up then, and of the re-send of unclaimed jobs.
                self.server = server
                logger.info("broker watch: broker %s", server)
                return []
            if server != self.server:
                logger.warning("broker watch: the broker restarted (%s, was %s)", server, self.server)
                self.server, self.rechecks = server, self.RECHECKS + 1
            if self.rechecks <= 0:
                return []
            snapshot = broker_snapshot(broker_queues())
        except Exception as exc:  # noqa: BLE001 - the broker is away: nothing to compare until it is back
            logger.info("broker watch: broker unreachable (%s)", exc)
            return []
        if snapshot is None or snapshot.server != self.server:
            return []  # restarted again meanwhile: the next sweep starts over
        resent = jobs_resend_missing(on_broker=set(snapshot.task_ids), queues=broker_queues())
        # Counted once the comparison went through: a sweep that failed half-way tries again.
        self.rechecks -= 1
        return resent


JOB_QUEUES = tuple(queue.value for queue in Queue)


def broker_queues() -> tuple[str, ...]:
    """The job queues whose messages the broker carries (under the Slurm executor, not ``gpu``)."""
    return tuple(queue for queue in JOB_QUEUES if not (queue == Queue.GPU and executor() == "slurm"))


def _reconcile_slurm() -> None:
    try:
        done = jobs_reconcile_slurm()
    except SlurmError as exc:
        logger.warning("reaper: Slurm did not answer (%s); next sweep", exc.message)
        return
    for job in done.resubmitted:
        logger.warning("reaper: job %s's batch job was gone; submitted again", job.uuid)
    for job in done.ended:
        logger.warning("reaper: job %s attempt %s -> %s (Slurm)", job.uuid, job.attempt, job.status)


def _reaper_loop(interval: float, stale_after: float, requeue_after: float) -> None:
    broker = BrokerWatch()
    while not _reaper_stop.wait(interval):
        try:
            for job in broker.sweep():
                logger.warning("reaper: job %s was not on the restarted broker; message sent again", job.uuid)
            for job in jobs_reap_stale(stale_after_seconds=stale_after):
                logger.warning("reaper: job %s attempt %s -> %s", job.uuid, job.attempt, job.status)
            if executor() == "slurm":
                _reconcile_slurm()
            if requeue_after > 0:
                for job in jobs_republish_unclaimed(queued_after_seconds=requeue_after):
                    logger.warning("reaper: job %s still queued; message sent again (%s)", job.uuid, job.publishes)
            resent = agent_messages_republish()
            if resent:
                logger.warning("reaper: %d lost agent message(s) sent again", resent)
            scratch_sweep()
        except DatabaseError:
            logger.warning("reaper sweep failed; retrying next interval", exc_info=True)
        finally:
            # Closed after each sweep: a pool child forked meanwhile must not inherit a live one.
            connection.close()


@signals.worker_ready.connect
def reaper_start(**kwargs: Any) -> None:
    config = engine_config()
    if config.reaper_interval_seconds <= 0:
        return
    _reaper_stop.clear()
    thread = threading.Thread(
        target=_reaper_loop,
        args=(config.reaper_interval_seconds, config.stale_after_seconds, config.requeue_after_seconds),
        name="job-reaper",
        daemon=True,
    )
    thread.start()
    logger.info(
        "job reaper started: every %.1fs, stale after %.1fs, re-send queued after %.1fs",
        config.reaper_interval_seconds,
        config.stale_after_seconds,
        config.requeue_after_seconds,
    )


@signals.worker_shutdown.connect
def reaper_stop(**kwargs: Any) -> None:
    _reaper_stop.set()
