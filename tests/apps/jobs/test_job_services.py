"""The job status machine, claims, heartbeats, cancel and the reaper, on the real PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.core.errors import ApplicationError, Conflict
from apps.experiments.events import chain_verify
from apps.experiments.models import Event
from apps.jobs import services
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job, JobLogLine, JobTransition
from apps.live.groups import job_group, run_group
from apps.research.models import Run
from tests.factories import make_run


def enqueue(run, **overrides) -> Job:
    spec = overrides.pop("spec", {"input_checkpoint": str(run.base_checkpoint.uuid)})
    return services.job_enqueue(kind=overrides.pop("kind", JobKind.TRAIN), spec=spec, run=run, **overrides)


def make_stale(job: Job, seconds: float = 600) -> None:
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def statuses(job: Job) -> list[tuple[str, str]]:
    return list(JobTransition.objects.filter(job=job).order_by("pk").values_list("from_status", "to_status"))


@pytest.mark.django_db
def test_enqueue_records_versions_queue_and_first_transition(run):
    job = enqueue(run, seed=7)

    assert (job.status, job.queue, job.seed, job.attempt) == (JobStatus.QUEUED, "gpu", 7, 1)
    enqueued = job.versions["enqueued"]
    assert enqueued["packages"]["torch"]
    assert enqueued["packages"]["transformers"]
    assert len(enqueued["code"]["commit"]) == 40
    assert statuses(job) == [("", "queued")]
    assert services.job_enqueue(kind=JobKind.DATA, spec={"operation": "filter"}, run=run).queue == "default"
    with pytest.raises(ApplicationError):
        services.job_enqueue(kind="bake", spec={"x": 1}, run=run)


@pytest.mark.django_db(transaction=True)
def test_two_racing_claims_have_exactly_one_winner(run):
    job = enqueue(run)
    barrier = threading.Barrier(2)
    results: dict[str, Job | None] = {}

    def claim(worker: str) -> None:
        try:
            barrier.wait()
            results[worker] = services.job_claim(job_id=job.pk, worker=worker)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(name,)) for name in ("host-a:1", "host-b:2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    winners = [name for name, claimed in results.items() if claimed is not None]
    assert len(winners) == 1
    job.refresh_from_db()
    assert (job.status, job.worker) == (JobStatus.RUNNING, winners[0])
    assert statuses(job) == [("", "queued"), ("queued", "running")]
    assert "executed" in job.versions
    # A redelivered message later finds nothing to claim.
    assert services.job_claim(job_id=job.pk, worker="host-c:3") is None


@pytest.mark.django_db
def test_terminal_statuses_are_never_overwritten(run):
    job = services.job_claim(job_id=enqueue(run).pk, worker="w:1")
    services.job_succeed(job=job, result={"ok": True})

    with pytest.raises(Conflict):
        services.job_fail(job=job, error="late failure")
    with pytest.raises(Conflict):
        services.job_cancel(job=job)
    with pytest.raises(Conflict):
        services.job_request_cancel(job=job, actor="user:alice")
    with pytest.raises(Conflict):
        services.job_succeed(job=job, result={"again": True})

    job.refresh_from_db()
    assert (job.status, job.result, job.error) == (JobStatus.SUCCEEDED, {"ok": True}, "")
    assert statuses(job) == [("", "queued"), ("queued", "running"), ("running", "succeeded")]
    # A queued job cannot succeed without being claimed first.
    with pytest.raises(Conflict):
        services.job_succeed(job=enqueue(run), result={})


@pytest.mark.django_db
def test_cancel_of_a_queued_job_is_immediate_and_its_message_is_then_ignored(run):
    job = enqueue(run)

    cancelled = services.job_request_cancel(job=job, actor="user:alice")

    assert cancelled.status == JobStatus.CANCELLED
    assert cancelled.cancel_requested
    assert services.job_claim(job_id=job.pk, worker="w:1") is None


@pytest.mark.django_db
def test_cancel_of_a_running_job_is_a_flag_the_heartbeat_returns(run):
    job = services.job_claim(job_id=enqueue(run).pk, worker="w:1")
    assert services.job_heartbeat(job=job, progress=0.25) == services.Beat(alive=True, cancel_requested=False)

    services.job_request_cancel(job=job, actor="user:alice")
    services.job_request_cancel(job=job, actor="user:alice")  # idempotent

    beat = services.job_heartbeat(job=job, progress=0.5)
    assert beat == services.Beat(alive=True, cancel_requested=True)
    job.refresh_from_db()
    assert (job.status, job.progress) == (JobStatus.RUNNING, 0.5)
    assert Event.objects.filter(type="job.cancel_requested", run=run).count() == 1
    assert services.job_cancel(job=job).status == JobStatus.CANCELLED


@pytest.mark.django_db
def test_reaper_marks_a_silent_job_lost_and_queues_exactly_one_next_attempt(run):
    job = services.job_claim(job_id=enqueue(run, seed=3).pk, worker="dead-host:9")
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=700))
    make_stale(job, 600)
    fresh = services.job_claim(job_id=enqueue(run).pk, worker="live-host:1")

    reaped = services.jobs_reap_stale(stale_after_seconds=60)

    assert [j.pk for j in reaped] == [job.pk]
    lost = Job.objects.get(pk=job.pk)
    retry = lost.next_attempt
    assert lost.status == JobStatus.LOST
    assert "no heartbeat from dead-host:9" in JobTransition.objects.filter(job=lost).last().reason
    assert (retry.status, retry.attempt, retry.seed, retry.spec, retry.kind) == (
        JobStatus.QUEUED, 2, 3, lost.spec, lost.kind,
    )  # fmt: skip
    assert Job.objects.get(pk=fresh.pk).status == JobStatus.RUNNING
    # Only the 100 s between start and the last heartbeat are charged, not the silent tail.
    assert lost.resource_seconds == pytest.approx(100, abs=2)
    assert Run.objects.get(pk=run.pk).used_accelerator_seconds == pytest.approx(100, abs=2)
    # A second sweep finds nothing; the database refuses a second retry of the same attempt.
    assert services.jobs_reap_stale(stale_after_seconds=60) == []
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(kind=lost.kind, queue=lost.queue, run=run, attempt=2, previous_attempt=lost)
    # The lost attempt's worker, if it was only slow, can no longer report or succeed.
    assert services.job_heartbeat(job=job).alive is False
    with pytest.raises(Conflict):
        services.job_succeed(job=job, result={})


@pytest.mark.django_db
def test_reaper_gives_up_after_max_attempts_and_respects_time_limits_and_cancels(run):
    earlier = enqueue(run)
    last = services.job_claim(job_id=enqueue(run).pk, worker="w:1")
    Job.objects.filter(pk=last.pk).update(attempt=3, previous_attempt=earlier)
    overdue = services.job_claim(job_id=enqueue(run, time_limit_seconds=10).pk, worker="w:2")
    Job.objects.filter(pk=overdue.pk).update(started_at=timezone.now() - timedelta(seconds=3600))
    cancelled = services.job_claim(job_id=enqueue(run).pk, worker="w:3")
    services.job_request_cancel(job=cancelled, actor="user:bob")
    for job in (last, overdue, cancelled):
        make_stale(job)

    services.jobs_reap_stale(stale_after_seconds=60, max_attempts=3)

    last.refresh_from_db()
    assert last.status == JobStatus.LOST
    assert not Job.objects.filter(previous_attempt=last).exists()
    overdue.refresh_from_db()
    assert overdue.status == JobStatus.FAILED
    assert "time limit" in overdue.error
    assert Job.objects.get(pk=cancelled.pk).status == JobStatus.CANCELLED


@pytest.mark.django_db
def test_reaper_sends_an_unclaimed_queued_jobs_message_again_with_back_off(
    run, monkeypatch, django_capture_on_commit_callbacks
):
    sent: list[int] = []
    monkeypatch.setattr(services, "_send_message", lambda job, **_: sent.append(job.pk))
    waiting = enqueue(run)  # its message is lost: no worker will ever see it
    claimed = services.job_claim(job_id=enqueue(run).pk, worker="host-a:1")
    young = enqueue(run)
    for job in (waiting, claimed):
        Job.objects.filter(pk=job.pk).update(published_at=timezone.now() - timedelta(seconds=100))

    with django_capture_on_commit_callbacks(execute=True):
        republished = services.jobs_republish_unclaimed(queued_after_seconds=60)

    # Only the queued job older than the threshold, with the same row, id and task id.
    assert [job.pk for job in republished] == sent == [waiting.pk]
    again = Job.objects.get(pk=waiting.pk)
    assert (again.status, again.publishes, again.celery_id) == (JobStatus.QUEUED, 2, waiting.celery_id)
    assert timezone.now() - again.published_at < timedelta(seconds=5)
    assert statuses(again) == [("", "queued")]  # a re-send is not a status change
    event = Event.objects.get(type="job.republished")
    assert (event.run_id, event.actor, event.arguments["job"], event.arguments["publishes"]) == (
        run.pk,
        "reaper",
        str(waiting.uuid),
        2,
    )
    assert "sent again to queue gpu" in JobLogLine.objects.get(job=again).text
    assert Job.objects.get(pk=young.pk).publishes == 1
    assert Job.objects.get(pk=claimed.pk).publishes == 1

    # Backing off: after one re-send the next waits twice the threshold.
    Job.objects.filter(pk=waiting.pk).update(published_at=timezone.now() - timedelta(seconds=100))
    assert services.jobs_republish_unclaimed(queued_after_seconds=60) == []
    Job.objects.filter(pk=waiting.pk).update(published_at=timezone.now() - timedelta(seconds=130))
    with django_capture_on_commit_callbacks(execute=True):
        assert len(services.jobs_republish_unclaimed(queued_after_seconds=60)) == 1
    assert sent == [waiting.pk, waiting.pk]
    assert Job.objects.get(pk=waiting.pk).publishes == 3
    assert chain_verify(str(run.uuid)).ok


@pytest.mark.django_db
def test_after_a_broker_restart_the_queued_jobs_it_does_not_hold_are_sent_again_at_once(
    run, monkeypatch, django_capture_on_commit_callbacks
):
    sent: list[int] = []
    monkeypatch.setattr(services, "_send_message", lambda job, **_: sent.append(job.pk))
    lost, kept, other_queue, young = enqueue(run), enqueue(run), enqueue(run, queue="default"), enqueue(run)
    claimed = services.job_claim(job_id=enqueue(run).pk, worker="host-a:1")
    # Sent seconds ago (a just-sent message may still be on its way), well inside the re-send timer.
    for job in (lost, kept, other_queue, claimed):
        Job.objects.filter(pk=job.pk).update(published_at=timezone.now() - timedelta(seconds=10))

    with django_capture_on_commit_callbacks(execute=True):
        resent = services.jobs_resend_missing(on_broker={kept.celery_id}, queues=("gpu",))

    # Only the queued gpu job whose message the broker lacks; the same row and task id, at once.
    assert [job.pk for job in resent] == sent == [lost.pk]
    again = Job.objects.get(pk=lost.pk)
    assert (again.status, again.publishes, again.celery_id) == (JobStatus.QUEUED, 2, lost.celery_id)
    event = Event.objects.get(type="job.republished")
    assert "not on the broker" in event.arguments["reason"]
    assert all(Job.objects.get(pk=j.pk).publishes == 1 for j in (kept, other_queue, young, claimed))
    assert chain_verify(str(run.uuid)).ok


@pytest.mark.django_db
def test_report_streams_metrics_points_and_log_lines_until_the_job_ends(run):
    job = services.job_claim(job_id=enqueue(run).pk, worker="w:1")

    services.job_report(job=job, metrics_point={"step": 10, "loss": 2.5, "tokens_per_second": 900.0})
    services.job_report(job=job, metrics_point={"step": 20, "loss": 1.5}, log_line="step 20", progress=0.2)
    services.job_report(job=job, log_line="step 30")
    services.job_succeed(job=job, result={})
    services.job_report(job=job, metrics_point={"step": 40, "loss": 0.1}, log_line="too late")

    job.refresh_from_db()
    assert [p["loss"] for p in job.metrics["points"]] == [2.5, 1.5]
    assert job.metrics["last"] == {"step": 20, "loss": 1.5, "tokens_per_second": 900.0}
    assert list(JobLogLine.objects.filter(job=job).order_by("seq").values_list("seq", "text")) == [
        (1, "step 20"), (2, "step 30"),
    ]  # fmt: skip
    assert job.progress == 1.0  # success sets it


@pytest.mark.django_db
def test_every_transition_is_an_event_on_the_runs_hash_chain(run):
    job = services.job_claim(job_id=enqueue(run).pk, worker="w:1")
    services.job_fail(job=job, error="Traceback ...\nValueError: bad data")

    types = list(Event.objects.filter(run=run, type__startswith="job.").order_by("seq").values_list("type", flat=True))
    assert types == ["job.queued", "job.running", "job.failed"]
    assert chain_verify(str(run.uuid)).ok
    job.refresh_from_db()
    assert statuses(job)[-1] == ("running", "failed")
    assert JobTransition.objects.filter(job=job).last().reason == "ValueError: bad data"


@pytest.mark.django_db(transaction=True)
def test_transitions_and_progress_are_published_to_the_job_and_run_groups(run):
    layer = get_channel_layer()
    job = enqueue(run)
    job_channel = async_to_sync(layer.new_channel)()
    run_channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(job_group(job.uuid), job_channel)
    async_to_sync(layer.group_add)(run_group(run.uuid), run_channel)

    def receive(channel: str) -> dict:
        async def within() -> dict:
            return await asyncio.wait_for(layer.receive(channel), 5)

        return async_to_sync(within)()

    claimed = services.job_claim(job_id=job.pk, worker="w:1")
    services.job_heartbeat(job=claimed, progress=0.3)

    updated = receive(job_channel)
    assert (updated["type"], updated["event"]) == ("live.event", "job.updated")
    assert updated["payload"]["uuid"] == str(job.uuid)
    assert (updated["payload"]["status"], updated["payload"]["worker"]) == ("running", "w:1")
    assert set(updated["payload"]) >= {"kind", "attempt", "progress", "started_at", "metrics_last", "error"}
    assert receive(run_channel)["payload"] == updated["payload"]
    progress = receive(job_channel)
    assert (progress["event"], progress["payload"]) == ("job.progress", {"uuid": str(job.uuid), "progress": 0.3})


@pytest.mark.django_db
def test_a_diverged_loss_is_recorded_as_null_not_an_error(run):
    job = services.job_claim(job_id=enqueue(run).pk, worker="w:1")

    services.job_report(job=job, metrics_point={"step": 10, "loss": float("nan"), "grad_norm": float("inf")})
    services.job_succeed(job=job, result={"final_loss": float("nan"), "steps": 10})

    job.refresh_from_db()
    assert job.metrics["points"] == [{"step": 10, "loss": None, "grad_norm": None}]
    assert job.result == {"final_loss": None, "steps": 10}


@pytest.mark.django_db
def test_a_job_yields_its_turn_only_to_a_run_waiting_with_fewer_jobs_running():
    a, b = make_run(name="a"), make_run(name="b")

    def queued(run, kind=JobKind.DATA, queue=None):
        return services.job_enqueue(kind=kind, spec={"x": 1}, run=run, **({"queue": queue} if queue else {}))

    def running(run):
        return services.job_claim(job_id=queued(run).pk, worker="host:1")

    a_next = queued(a)
    assert not services.job_yields_turn(job=a_next)  # nobody else waits
    b_next = queued(b)
    assert not services.job_yields_turn(job=a_next)  # a runs nothing yet: every run gets a slot
    running(a)
    assert services.job_yields_turn(job=a_next)  # a runs one, b waits with none
    assert not services.job_yields_turn(job=b_next)
    running(b)
    assert not services.job_yields_turn(job=a_next)  # one each: first in, first out again
    running(a)
    assert services.job_yields_turn(job=a_next)
    # Other queues, final evaluations and jobs of no run are not counted or never yield.
    assert not services.job_yields_turn(job=queued(a, queue="gpu"))
    assert not services.job_yields_turn(job=queued(a, kind=JobKind.FINAL_EVAL))
    assert not services.job_yields_turn(job=services.job_enqueue(kind=JobKind.DATA, spec={"x": 1}))
