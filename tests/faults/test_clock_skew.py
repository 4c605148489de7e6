"""Clocks that disagree fail nothing: every lease, heartbeat and reaper reads the database's clock.

The gpu worker runs 90 s slow and the default worker (whose reaper sweeps every second, stale
after 6 s) 90 s fast, each under libfaketime (``apt-get install faketime``), a real shift of the
process's wall clock. Read by its host's clock, every heartbeat of the training would look 180 s
old to that reaper (issue 35: healthy attempts declared lost, an experiment failed). Times come
from the database (apps.core.clock), so the training runs once to the end, as attempt 1, and
its run's events are in time order along the chain.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from apps.experiments.models import Event
from apps.jobs.choices import JobStatus
from apps.jobs.models import Job, JobTransition
from tests.faults.test_full_disk import ended
from tests.workers.agents.stack import wait_for

pytestmark = pytest.mark.slow

SKEW_SECONDS = 90
LIBFAKETIME = sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))


def skewed(seconds: int) -> dict[str, str]:
    """The environment that shifts a process's clocks by ``seconds``. Monotonic time shifts too
    (harmless: only its differences are read); with ``FAKETIME_DONT_FAKE_MONOTONIC`` libfaketime
    0.9.10 made every timed sleep and wait fail with EINVAL."""
    if not LIBFAKETIME:
        pytest.fail("libfaketime is not installed (apt-get install faketime): this test shifts a worker's clock")
    return {"LD_PRELOAD": str(LIBFAKETIME[0]), "FAKETIME": f"{seconds:+d}", "FAKETIME_NO_CACHE": "1"}


def clock_of(log: str) -> timedelta:
    """How far the clock of the process that wrote ``log`` is from this one (its last log line's time)."""
    stamps = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+: ", log, flags=re.MULTILINE)
    written = datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.get_current_timezone())
    return written - timezone.now()


def test_a_worker_whose_clock_is_90_s_off_declares_nothing_healthy_lost(project, training):
    gpu = project("gpu", **skewed(-SKEW_SECONDS))
    reaper = project("default", **skewed(+SKEW_SECONDS))
    # The shift took: each process logs in its own time (its last line was written a few seconds
    # ago, so the slow one reads a little slower still, the fast one a little less fast).
    assert clock_of(gpu.log("gpu")) < -timedelta(seconds=SKEW_SECONDS - 5)
    assert clock_of(reaper.log("default")) > timedelta(seconds=SKEW_SECONDS - 45)

    job = training(max_steps=60)
    wait_for(lambda: Job.objects.get(pk=job.pk).status != JobStatus.QUEUED, timeout=120,
             what="the training to start", stack=gpu.stack)  # fmt: skip
    [done] = wait_for(lambda: ended([job]), timeout=300, what="the training to end", stack=gpu.stack)
    assert done.status == JobStatus.SUCCEEDED, (done.status, done.error[-2000:], reaper.log("default")[-3000:])
    # It ran for longer than the stale threshold (6 s) under the fast reaper's sweeps.
    assert done.finished_at - done.started_at > timedelta(seconds=6)
    assert "reaper: job" not in reaper.log("default")
    assert Job.objects.count() == 1
    history = list(JobTransition.objects.filter(job=done).order_by("pk").values_list("to_status", flat=True))
    assert history == [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED]
    # Times on the database's clock: the job's within seconds of now (neither 90 s behind nor
    # ahead), and the run's events in time order along the chain.
    now = timezone.now()
    assert now - timedelta(seconds=300) < done.started_at < done.finished_at <= now + timedelta(seconds=5)
    times = list(Event.objects.filter(run=training.run).order_by("seq", "pk").values_list("created_at", flat=True))
    assert len(times) >= 3
    assert times == sorted(times)
    assert all(abs(now - t) < timedelta(seconds=300) for t in times)
