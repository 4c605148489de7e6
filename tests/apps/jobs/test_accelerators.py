"""Multi-device jobs in the scheduler: all devices on one host or none, caps, device-second charging."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.core.errors import ApplicationError
from apps.integrity.submission_parts import accelerators
from apps.jobs import services
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job
from tests.factories import make_run

pytestmark = pytest.mark.django_db


def gpu_job(run, n: int, kind: str = JobKind.TRAIN) -> Job:
    return services.job_enqueue(kind=kind, spec={"x": 1}, run=run, accelerators=n)


def claim(job: Job, host: str = "h", devices: int = 8) -> Job | None:
    return services.job_claim(job_id=job.pk, worker=f"{host}:{job.pk}", host_devices=devices)


def test_a_job_takes_all_its_devices_on_one_host_or_none():
    run = make_run(policy={"accelerators_per_run": 16})
    a, b = claim(gpu_job(run, 4)), claim(gpu_job(run, 4))
    assert a is not None
    assert b is not None
    assert sorted(a.devices + b.devices) == list(range(8))  # disjoint, all of the host
    one = gpu_job(run, 1)
    with pytest.raises(services.DevicesBusy):
        claim(one)
    one.refresh_from_db()
    assert (one.status, one.devices, one.worker) == (JobStatus.QUEUED, [], "")  # holds nothing while it waits
    assert claim(one, host="g") is not None  # another host has room
    services.job_succeed(job=a, result={})
    c = claim(gpu_job(run, 1))
    assert c is not None
    assert c.devices[0] in a.devices
    # 3 devices free: a 4-device job takes none of them (no partial hold to deadlock on).
    four = gpu_job(run, 4)
    with pytest.raises(services.DevicesBusy, match="needs 4 devices; 3 of 8 are free"):
        claim(four)
    assert Job.objects.get(pk=four.pk).devices == []


def test_the_run_cap_bounds_the_devices_its_jobs_hold_but_not_final_evaluations():
    run = make_run(policy={"accelerators_per_run": 4})
    assert claim(gpu_job(run, 4), devices=16) is not None
    with pytest.raises(services.DevicesBusy, match="holds 4 of its 4"):
        claim(gpu_job(run, 1), devices=16)
    assert claim(gpu_job(run, 1, kind=JobKind.FINAL_EVAL), devices=16) is not None
    other = make_run(name="other", policy={"accelerators_per_run": 4})
    assert claim(gpu_job(other, 2), devices=16) is not None  # the cap is per run


def test_the_budget_is_charged_per_device_second():
    run = make_run()
    job = claim(gpu_job(run, 4))
    assert job is not None
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=10))
    done = services.job_succeed(job=job, result={})
    assert 40 <= done.resource_seconds < 44
    run.refresh_from_db()
    assert 40 <= run.used_accelerator_seconds < 44


def test_fair_share_counts_devices_not_jobs():
    a, b = make_run(name="a", policy={"accelerators_per_run": 8}), make_run(name="b")
    assert claim(gpu_job(a, 4)) is not None
    b_next = gpu_job(b, 1)
    assert claim(b_next, host="g") is not None
    b_more, a_more = gpu_job(b, 1), gpu_job(a, 1)
    claim(gpu_job(b, 1), host="g")  # b: 2 devices, a: 4
    assert services.job_yields_turn(job=a_more)  # b waits with fewer devices running
    assert not services.job_yields_turn(job=b_more)


def test_bad_requests_are_refused():
    run = make_run()
    for bad in (0, 9, True, 1.5):
        with pytest.raises(ApplicationError, match="1 to 8 accelerators"):
            services.job_enqueue(kind=JobKind.TRAIN, spec={"x": 1}, run=run, accelerators=bad)
    assert accelerators({}, {"accelerators_per_job": 1}) == 1
    assert accelerators({"accelerators": 4}, {"accelerators_per_job": 4}) == 4
    with pytest.raises(ApplicationError, match="over the run policy's cap of 2"):
        accelerators({"accelerators": 4}, {"accelerators_per_job": 2})
    with pytest.raises(ApplicationError, match="integer from 1 to 8"):
        accelerators({"accelerators": "4"}, {"accelerators_per_job": 8})
