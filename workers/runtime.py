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
from pathlib import Path
from typing import Any

from celery import Task, signals
from celery.exceptions import SoftTimeLimitExceeded
from django.db import DatabaseError, close_old_connections, connection

from apps.benchmarks.services import checkpoint_local_dir
from apps.core.errors import Conflict
from apps.core.hashing import sha256_file, sha256_tree
from apps.datapool.storage import artifact_store
from apps.jobs.choices import JOB_ACTIVE_STATES, JobStatus
from apps.jobs.models import Job
from apps.jobs.selectors import job_get
from apps.jobs.services import (
    engine_config,
    job_cancel,
    job_claim,
    job_fail,
    job_heartbeat,
    job_report,
    jobs_reap_stale,
    jobs_republish_unclaimed,
    scratch_root,
)
from apps.research.agent_loops import agent_messages_republish

logger = logging.getLogger(__name__)


def worker_name() -> str:
    """Who holds a job: host and process id (unique while the process lives)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class JobTask(Task):  # type: ignore[misc]
    """Base of job tasks: an exception that escapes the task body fails the job with its traceback.

    Only a job this process holds is failed: a task that crashed before its claim must not fail
    a job another worker is running.
    """

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        job = job_get(job_id=(kwargs or {}).get("job_id", -1))
        if job is None or job.status != JobStatus.RUNNING or job.worker != worker_name():
            return
        summary = "time limit exceeded" if isinstance(exc, SoftTimeLimitExceeded) else f"{type(exc).__name__}: {exc}"
        try:
            job_fail(job=job, error=f"{einfo.traceback}\n{summary}")
        except Conflict:
            logger.info("job %s ended before its failure could be recorded", job.uuid)


def job_start(*, job_id: int) -> Job | None:
    """Fetch and claim the job a message points at; None (logged) when there is nothing to run."""
    job = job_get(job_id=job_id)
    if job is None:
        logger.warning("job %s does not exist; message dropped", job_id)
        return None
    claimed = job_claim(job_id=job_id, worker=worker_name())
    if claimed is None:
        # A redelivered message, a duplicate, or a job cancelled while queued: nothing to do.
        logger.info("job %s is %s, not queued; another worker has or had it", job.uuid, job.status)
    return claimed


class RunningJob:
    """Keeps a claimed job alive while its body runs, and tells the body when to stop.

    A background thread beats every ``heartbeat_seconds`` (carrying the latest progress) and
    reads the cancel flag, so ``should_stop()`` is a memory read the trainer can call every step.
    It says stop on a cancel request, when the job is no longer ours (the reaper declared it
    lost), and at the job's time limit (a cooperative limit that also works in the solo pool).
    """

    def __init__(self, job: Job) -> None:
        self.job = job
        self.interval = engine_config().heartbeat_seconds
        self.deadline = time.monotonic() + job.time_limit_seconds
        self._progress: float | None = None
        self._done = threading.Event()
        self._cancel = threading.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{job.pk}", daemon=True)

    def __enter__(self) -> RunningJob:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=30)

    def _beat(self) -> None:
        try:
            while not self._done.wait(self.interval):
                try:
                    beat = job_heartbeat(job=self.job, progress=self._progress)
                except DatabaseError:
                    # One missed beat is not a death: the reaper waits several intervals.
                    logger.warning("job %s: heartbeat failed", self.job.uuid, exc_info=True)
                    close_old_connections()
                    continue
                if beat.cancel_requested:
                    self._cancel.set()
                if not beat.alive:
                    self._lost.set()
        finally:
            connection.close()  # this thread's own connection

    # --- hooks for the runner ---------------------------------------------------------------

    def should_stop(self) -> bool:
        return self._cancel.is_set() or self._lost.is_set() or time.monotonic() > self.deadline

    def on_progress(self, fraction: float) -> None:
        self._progress = fraction  # written to the row by the next heartbeat

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        point = {"step": step, **{k: round(v, 6) for k, v in metrics.items()}}
        text = " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        job_report(job=self.job, metrics_point=point, log_line=f"step {step}: {text}")

    def log(self, text: str) -> None:
        job_report(job=self.job, log_line=text)

    # --- ending after should_stop() ------------------------------------------------------------

    def finish_stopped(self) -> None:
        """Record why the body stopped early: cancelled, over time, or (lost) nothing to record."""
        if self._lost.is_set():
            logger.info("job %s was taken from this worker (reaped); stopping without a result", self.job.uuid)
            return
        try:
            if self._cancel.is_set():
                job_cancel(job=self.job)
            else:
                job_fail(job=self.job, error=f"time limit of {self.job.time_limit_seconds}s exceeded")
        except Conflict:
            logger.info("job %s ended elsewhere while stopping", self.job.uuid)


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


def _reaper_loop(interval: float, stale_after: float, requeue_after: float) -> None:
    while not _reaper_stop.wait(interval):
        try:
            for job in jobs_reap_stale(stale_after_seconds=stale_after):
                logger.warning("reaper: job %s attempt %s -> %s", job.uuid, job.attempt, job.status)
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
