"""Redis restarts without persistence: the queued jobs whose messages it lost run again at once.

The database knows what is queued; the broker came back empty. The gpu worker's reaper notices
the new broker (its identity changed) and sends the messages of the queued jobs it does not
hold, so the gpu slot is busy again within seconds, not after ``RSI_JOB_REQUEUE_SECONDS``
(300 s here, the shipped default: that re-send cannot be what rescues them).
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from apps.experiments.models import Event
from apps.jobs.choices import JobStatus
from apps.jobs.models import Job, JobTransition
from tests.faults.test_full_disk import ended
from tests.workers.agents.stack import wait_for

pytestmark = pytest.mark.slow

BUSY_AGAIN_SECONDS = 30


def _status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def test_queued_jobs_lost_by_an_unpersisted_broker_restart_run_within_seconds(project, training, redis_server):
    gpu = project("gpu", RSI_JOB_REQUEUE_SECONDS="300")
    wait_for(lambda: "broker watch: broker " in gpu.log("gpu"), timeout=30, what="the reaper to see the broker",
             stack=gpu.stack)  # fmt: skip
    first = training(max_steps=40)
    wait_for(lambda: _status(first) == JobStatus.RUNNING, timeout=120, what="the first training to start",
             stack=gpu.stack)  # fmt: skip
    waiting = [training(max_steps=4), training(max_steps=4)]
    wait_for(lambda: redis_server.client().llen("gpu") == 2, timeout=30, what="both messages on the broker")
    assert _status(first) == JobStatus.RUNNING, "the first training ended before the broker restart"

    redis_server.kill()  # no AOF: the two queued messages (and the running one's) are gone
    redis_server.start()
    restarted = time.monotonic()
    assert redis_server.client().llen("gpu") == 0
    # The reaper of the gpu worker sends both again within seconds of the broker's return.
    wait_for(lambda: Event.objects.filter(type="job.republished").count() >= 2, timeout=15,
             what="the lost messages to be sent again", stack=gpu.stack)  # fmt: skip
    assert time.monotonic() - restarted < 15

    done = wait_for(lambda: ended([first, *waiting]), timeout=300, what="the three trainings to end", stack=gpu.stack)
    first_done, *rest = done
    assert [job.status for job in done] == [JobStatus.SUCCEEDED] * 3, [(j.status, j.error[-500:]) for j in done]
    # The slot was busy again right after it freed: each waiting job started within seconds of
    # the previous one's end, far below the 300 s re-send.
    previous = first_done
    for job in rest:
        gap = job.started_at - previous.finished_at
        assert gap < timedelta(seconds=BUSY_AGAIN_SECONDS), (job.pk, gap)
        previous = job
    republished = Event.objects.filter(type="job.republished").order_by("pk")
    assert sorted(e.arguments["job"] for e in republished) == sorted(str(j.uuid) for j in waiting)
    assert all("not on the broker" in e.arguments["reason"] for e in republished)
    # Each ran once, as attempt 1.
    for job in done:
        assert job.attempt == 1
        history = list(JobTransition.objects.filter(job=job).order_by("pk").values_list("to_status", flat=True))
        assert history == [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED], (job.pk, history)
    assert Job.objects.count() == 3
