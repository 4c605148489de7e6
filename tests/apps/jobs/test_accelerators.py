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


def busy_host(run, n: int = 8, host: str = "h") -> list[Job]:
    """``n`` 1-device jobs running on ``host``, holding all its devices."""
    jobs = [claim(gpu_job(run, 1), host=host) for _ in range(n)]
    assert all(jobs)
    return jobs


def refused(job: Job, host: str = "h", devices: int = 8) -> str:
    with pytest.raises(services.DevicesBusy) as busy:
        claim(job, host=host, devices=devices)
    job.refresh_from_db()
    assert (job.status, job.devices) == (JobStatus.QUEUED, [])  # never a partial hold
    return busy.value.code


def test_a_stream_of_one_device_jobs_does_not_starve_a_waiting_four_device_job():
    run = make_run(policy={"accelerators_per_run": 16})
    running = busy_host(run)
    wide = gpu_job(run, 4)
    assert refused(wide) == "devices_busy"
    assert Job.objects.get(pk=wide.pk).reserved_host == "h"  # it waits, and the host is kept for it
    assert "reserved host h" in wide.log_lines.get().text
    for done in running[:3]:
        # A device frees; a new 1-device job asks for it before the wide job's message comes round.
        services.job_succeed(job=done, result={})
        assert refused(gpu_job(run, 1)) == "devices_reserved"
        assert refused(wide) == "devices_busy"
    services.job_succeed(job=running[3], result={})
    for _ in range(5):  # still only 4 free: every newcomer waits
        assert refused(gpu_job(run, 1)) == "devices_reserved"
    started = claim(wide)
    assert started is not None
    assert len(started.devices) == 4
    assert started.reserved_host == ""
    assert Job.objects.get(pk=wide.pk).reserved_host == ""  # the reservation ends with the claim
    # The host is free again for small jobs as soon as the wide job holds its devices.
    services.job_succeed(job=running[4], result={})
    assert claim(gpu_job(run, 1)) is not None


def test_small_jobs_backfill_only_the_devices_the_waiting_job_cannot_use():
    run = make_run(policy={"accelerators_per_run": 16})
    running = busy_host(run)
    wide = gpu_job(run, 4)
    refused(wide)
    for done in running[:6]:
        services.job_succeed(job=done, result={})
    # 6 free, 4 kept for the wide job: 2 may go to 1-device jobs, the third waits.
    assert claim(gpu_job(run, 1)) is not None
    assert claim(gpu_job(run, 1)) is not None
    assert refused(gpu_job(run, 1)) == "devices_reserved"
    assert refused(gpu_job(run, 2)) == "devices_reserved"
    assert claim(gpu_job(run, 1), host="g") is not None  # another host is not kept for it
    assert claim(wide) is not None


def test_two_four_device_jobs_share_an_eight_device_host_without_deadlock():
    run = make_run(policy={"accelerators_per_run": 16})
    running = busy_host(run)
    first, second = gpu_job(run, 4), gpu_job(run, 4)
    assert refused(first) == "devices_busy"
    assert refused(second) == "devices_busy"  # the host is reserved already: it waits behind
    assert Job.objects.get(pk=second.pk).reserved_host == ""
    order = []
    for done in running:
        services.job_succeed(job=done, result={})
        for job in (second, first):  # the later one asks first each time, and still waits its turn
            job.refresh_from_db()
            if job.status == JobStatus.QUEUED:
                try:
                    claimed = claim(job)
                except services.DevicesBusy:
                    continue
                assert claimed is not None
                order.append(claimed)
    assert [job.pk for job in order] == [first.pk, second.pk]  # both start, the longer waiting first
    assert sorted(order[0].devices + order[1].devices) == list(range(8))
    # Both 4-device jobs fit at once on an idle host: neither holds part of the host while waiting.
    services.job_succeed(job=order[0], result={})
    services.job_succeed(job=order[1], result={})
    a, b = gpu_job(run, 4), gpu_job(run, 4)
    assert claim(a) is not None
    assert claim(b) is not None


def test_final_evaluations_go_first_past_a_reservation_and_take_it_over():
    run = make_run(policy={"accelerators_per_run": 16})
    running = busy_host(run)
    wide = gpu_job(run, 4)
    refused(wide)
    services.job_succeed(job=running[0], result={})
    final = claim(gpu_job(run, 1, kind=JobKind.FINAL_EVAL))
    assert final is not None  # the freed device was kept for the wide job, but a final evaluation never waits
    wide_final = gpu_job(run, 4, kind=JobKind.FINAL_EVAL)
    assert refused(wide_final) == "devices_busy"
    assert Job.objects.get(pk=wide_final.pk).reserved_host == "h"  # taken over from the training
    assert Job.objects.get(pk=wide.pk).reserved_host == ""
    for done in running[1:5]:
        services.job_succeed(job=done, result={})
    assert refused(wide) == "devices_reserved"
    assert claim(wide_final) is not None
    assert refused(wide) == "devices_busy"  # it reserves the host again, next in line
    assert Job.objects.get(pk=wide.pk).reserved_host == "h"


def test_a_reservation_lapses_when_its_job_cannot_start_or_leaves_the_queue():
    run = make_run(policy={"accelerators_per_run": 16})
    running = busy_host(run)
    wide = gpu_job(run, 4)
    refused(wide)
    services.job_succeed(job=running[0], result={})
    assert refused(gpu_job(run, 1)) == "devices_reserved"
    services.job_request_cancel(job=wide, actor="test")
    assert claim(gpu_job(run, 1)) is not None  # a cancelled job keeps nothing
    # A job whose run holds its cap does not keep devices idle: it could not start anyway.
    capped = make_run(name="capped", policy={"accelerators_per_run": 4})
    assert claim(gpu_job(capped, 2), host="g") is not None
    waiting = gpu_job(capped, 4)
    assert refused(waiting) == "run_accelerators_cap"
    assert Job.objects.get(pk=waiting.pk).reserved_host == ""
    # A host too small for the job is never reserved for it.
    assert refused(gpu_job(run, 4), host="small", devices=2) == "devices_busy"
    assert not Job.objects.filter(reserved_host="small").exists()


def test_a_reservation_gives_way_to_fair_share_between_runs():
    a, b = make_run(name="a", policy={"accelerators_per_run": 16}), make_run(name="b")
    running = busy_host(a)
    wide = gpu_job(a, 4)
    refused(wide)
    b_job = gpu_job(b, 1)  # run b has nothing running: it goes before the wide job of a (8 running)
    services.job_succeed(job=running[0], result={})
    assert refused(gpu_job(a, 1)) == "devices_reserved"
    assert claim(b_job) is not None
    # Now a runs 7, b runs 1: another job of b still goes first, one of a does not.
    b_more = gpu_job(b, 1)
    services.job_succeed(job=running[1], result={})
    assert refused(gpu_job(a, 1)) == "devices_reserved"
    assert claim(b_more) is not None


def test_the_workers_claim_path_keeps_the_freed_devices_for_the_waiting_job(monkeypatch):
    # workers.runtime.job_start, as a gpu worker runs it for each message, on a 2-device host.
    from workers import runtime  # noqa: PLC0415 - the worker side, only here

    monkeypatch.setenv("RSI_HOST_DEVICES", "2")
    monkeypatch.setattr(runtime, "PASS_TURN_PAUSE_SECONDS", 0.0)
    run = make_run(policy={"accelerators_per_run": 8})
    first = runtime.job_start(job_id=gpu_job(run, 1).pk)
    assert first is not None
    wide = gpu_job(run, 2)
    sent = wide.published_at
    assert runtime.job_start(job_id=wide.pk) is None  # it waits, its message sent again
    wide.refresh_from_db()
    host = runtime.worker_name().rsplit(":", 1)[0]
    assert (wide.status, wide.reserved_host, wide.devices) == (JobStatus.QUEUED, host, [])
    assert wide.published_at > sent
    small = gpu_job(run, 1)
    assert runtime.job_start(job_id=small.pk) is None  # one device is free, and kept for the wide job
    services.job_succeed(job=first, result={})
    started = runtime.job_start(job_id=wide.pk)
    assert started is not None
    assert sorted(started.devices) == [0, 1]
    assert runtime.job_start(job_id=small.pk) is None  # nothing free now
    services.job_succeed(job=started, result={})
    assert runtime.job_start(job_id=small.pk) is not None


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
