"""The run and job websockets: who may connect, the snapshot, and snapshot + events == a fresh fetch.

Through the whole ASGI application (origin check, session auth, routing) and the real
channels_redis layer. Every event comes from the service that changed the state, after its
transaction commits (so these tests use a transactional database); nothing here publishes.
tests/apps/dashboard/test_service_events.py checks each service's event one by one.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from apps.dashboard.consumers import CLOSE_FORBIDDEN, CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED
from apps.dashboard.selectors import job_snapshot, run_snapshot
from apps.dashboard.services import guidance_post, run_control
from apps.experiments.services import experiment_create
from apps.expos.auth import agent_token_issue
from apps.jobs.services import job_claim, job_enqueue, job_report
from apps.live.events import LiveEvent
from apps.research.models import Guidance, Run
from apps.research.selectors import guidance_live
from apps.research.services import decision_record, guidance_mark_read, worker_add
from rsiweb.asgi import application
from tests.apps.dashboard import live_helpers as lh
from tests.apps.dashboard.live_helpers import QUIET_SECONDS, drain, next_event, open_socket, receive_snapshot
from tests.apps.dashboard.world import build_world

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def tworld(transactional_db):
    world = build_world()
    yield world
    # job_enqueue and run_resume put messages on the Celery queues; no worker will read them.
    redis.Redis.from_url(settings.REDIS_URL).delete("gpu", "agents", "default")


async def _refused_with(communicator: WebsocketCommunicator) -> int:
    """The close code of a connection the consumer refused; fails if anything else came first."""
    message = await communicator.receive_output(timeout=10)
    assert message["type"] == "websocket.close", f"expected a close, the consumer sent {message}"
    # Let the consumer finish as a browser's disconnect would (STYLE.md 30: always disconnect).
    await communicator.disconnect()
    return message["code"]


# --- who may connect ---------------------------------------------------------------------------


async def test_anonymous_visitor_is_refused_before_any_data(tworld):
    communicator = await open_socket(f"/ws/runs/{tworld.run.uuid}/")
    assert await _refused_with(communicator) == CLOSE_UNAUTHENTICATED


async def test_agent_token_does_not_open_the_websocket(tworld):
    token, _ = await database_sync_to_async(agent_token_issue)(run=tworld.run, node=tworld.nodes["w3"], role="worker")
    communicator = await open_socket(
        f"/ws/runs/{tworld.run.uuid}/", headers=[(b"authorization", f"Bearer {token}".encode())]
    )
    assert await _refused_with(communicator) == CLOSE_UNAUTHENTICATED


async def test_person_without_a_role_is_refused(tworld):
    communicator = await open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["nobody"])
    assert await _refused_with(communicator) == CLOSE_FORBIDDEN


async def test_unknown_run_and_job_are_refused(tworld):
    viewer = tworld.people["viewer"]
    for path in (f"/ws/runs/{uuid.uuid4()}/", f"/ws/jobs/{uuid.uuid4()}/"):
        communicator = await open_socket(path, user=viewer)
        assert await _refused_with(communicator) == CLOSE_NOT_FOUND


async def test_foreign_origin_is_rejected_at_the_handshake(tworld):
    cookie = await database_sync_to_async(lh.session_cookie)(tworld.people["viewer"])
    communicator = WebsocketCommunicator(
        application,
        f"/ws/runs/{tworld.run.uuid}/",
        headers=[(b"origin", b"http://evil.example"), (b"cookie", cookie)],
    )
    connected, _ = await communicator.connect(timeout=10)
    assert not connected
    await communicator.disconnect()


async def test_refused_socket_is_not_subscribed_to_the_run(tworld):
    nobody = await open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["nobody"])
    viewer = await open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["viewer"])
    await receive_snapshot(viewer)
    closed = await nobody.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": CLOSE_FORBIDDEN}

    await database_sync_to_async(guidance_post)(run=tworld.run, author=tworld.people["operator"], text="hello")

    assert (await next_event(viewer))["event"] == LiveEvent.GUIDANCE_CREATED
    assert await nobody.receive_nothing(timeout=0.5)  # the event went to the viewer only
    await nobody.disconnect()
    await viewer.disconnect()


# --- snapshot and events -----------------------------------------------------------------------


async def test_snapshot_on_connect_is_the_selectors_snapshot(tworld):
    communicator = await open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["viewer"])
    snapshot = await receive_snapshot(communicator)
    expected = lh.as_json(await database_sync_to_async(run_snapshot)(run=tworld.run))
    assert snapshot == expected
    # The world's DAG: three Workers, one Reviewer, two context/scope edges, three decisions.
    assert [n["handle"] for n in snapshot["nodes"]] == ["worker_0001", "worker_0002", "reviewer_0001", "worker_0003"]
    assert {e["kind"] for e in snapshot["edges"]} == {"context", "review_scope"}
    assert len(snapshot["decisions"]) == 3
    await communicator.disconnect()


async def test_large_snapshot_arrives_in_parts(tworld, monkeypatch):
    monkeypatch.setattr("apps.dashboard.consumers.SNAPSHOT_PART_RECORDS", 2)
    communicator = await open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["viewer"])
    begin = await communicator.receive_json_from(timeout=10)
    assert begin["type"] == "snapshot.begin"
    assert begin["data"]["nodes"] == []
    assert begin["data"]["run"]["name"]
    parts = []
    while (message := await communicator.receive_json_from(timeout=10))["type"] == "snapshot.part":
        assert len(message["records"]) <= 2
        parts.append(message)
    assert message["type"] == "snapshot.end"
    assert [p["key"] for p in parts].count("nodes") == 2  # four nodes, two per part
    assembled = begin["data"]
    for part in parts:
        assembled[part["key"]].extend(part["records"])
    assert assembled == lh.as_json(await database_sync_to_async(run_snapshot)(run=tworld.run))
    await communicator.disconnect()


def _grow(world) -> dict[str, Any]:
    """Change the run the way a live run changes, through the services only; returns what was made."""
    run, operator = world.run, world.people["operator"]
    made: dict[str, Any] = {}
    made["guidance"] = guidance_post(run=run, author=operator, text="Try DPO on the audited pairs.")
    run_control(run=run, action="pause", user=operator)
    run_control(run=run, action="resume", user=operator)
    # The Main Agent grows the DAG ...
    decision = decision_record(run=run, kind="branch", trigger="guidance", rationale="operator asked for DPO")
    worker = worker_add(run=run, task="DPO on audited pairs", predecessors=[world.nodes["w3"]], decision=decision)
    experiment = experiment_create(
        run=run, owner=worker, kind="train_eval", input_checkpoint=run.base_checkpoint, action={"recipe": "dpo"},
        parents=[world.exp["e1"]],
    )  # fmt: skip
    # ... the job engine runs its experiment ...
    job = job_enqueue(kind="train", spec={"recipe": "dpo"}, experiment=experiment)
    job_claim(job_id=job.pk, worker="gpu@test")
    job_report(job=job, progress=0.25, metrics_point={"step": 5, "loss": 1.2}, log_line="step 5: loss=1.2")
    job_report(job=job, progress=0.5)
    # ... and the Main Agent's next planning step reads the pending guidance.
    guidance_mark_read(run=run)
    made.update(decision=decision, worker=worker, experiment=experiment, job=job)
    return made


async def test_snapshot_plus_events_equals_a_fresh_snapshot(tworld):
    communicator = await open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["viewer"])
    state = lh.run_state(await receive_snapshot(communicator))

    made = await database_sync_to_async(_grow)(tworld)
    messages = await drain(communicator)

    events = [m["event"] for m in messages]
    expected_types = [
        LiveEvent.GUIDANCE_CREATED, LiveEvent.RUN_UPDATED, LiveEvent.NODE_CREATED, LiveEvent.EDGE_CREATED,
        LiveEvent.DECISION_CREATED, LiveEvent.EXPERIMENT_CREATED, LiveEvent.EXPERIMENT_UPDATED,
        LiveEvent.JOB_UPDATED, LiveEvent.JOB_PROGRESS, LiveEvent.GUIDANCE_UPDATED,
    ]  # fmt: skip
    for expected in expected_types:
        assert expected in events, f"{expected} never arrived: {events}"
    for message in messages:
        lh.apply_run_event(state, message["event"], message["payload"])
    fresh = lh.as_json(
        await database_sync_to_async(run_snapshot)(run=await database_sync_to_async(Run.objects.get)(pk=tworld.run.pk))
    )
    assert state == lh.run_state(fresh)
    # And the state is the grown run, not two equally stale copies.
    assert state["run"]["status"] == "running"
    assert state["nodes"][str(made["worker"].uuid)]["decision"] == str(made["decision"].uuid)
    assert state["jobs"][str(made["job"].uuid)]["progress"] == 0.5
    assert state["experiments"][str(made["experiment"].uuid)]["status"] == "running"
    assert all(g["applied_at"] for g in state["guidance"].values())
    await communicator.disconnect()


async def test_guidance_created_event_has_the_snapshot_shape(tworld):
    communicator = await open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["viewer"])
    await receive_snapshot(communicator)

    guidance = await database_sync_to_async(guidance_post)(
        run=tworld.run, author=tworld.people["operator"], text="  Keep θ0's template.  "
    )

    message = await communicator.receive_json_from(timeout=10)  # the socket was idle: the event comes alone
    expected = lh.as_json(
        await database_sync_to_async(
            lambda: guidance_live(Guidance.objects.select_related("author").get(pk=guidance.pk))
        )()
    )
    assert message == {"type": "events", "events": [{"event": LiveEvent.GUIDANCE_CREATED, "payload": expected}]}
    assert expected["text"] == "Keep θ0's template."
    assert expected["applied_at"] is None
    await communicator.disconnect()


async def test_reconnect_gets_a_snapshot_with_what_it_missed(tworld):
    first = await open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["viewer"])
    before = await receive_snapshot(first)
    await first.disconnect()

    await database_sync_to_async(_grow)(tworld)  # happens while the browser is away

    second = await open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["viewer"])
    after = await receive_snapshot(second)
    fresh = lh.as_json(
        await database_sync_to_async(run_snapshot)(run=await database_sync_to_async(Run.objects.get)(pk=tworld.run.pk))
    )
    assert after == fresh
    assert len(after["nodes"]) == len(before["nodes"]) + 1
    await second.disconnect()


async def test_job_socket_snapshot_plus_progress_equals_a_fresh_snapshot(tworld):
    job = tworld.jobs["running"]
    communicator = await open_socket(f"/ws/jobs/{job.uuid}/", user=tworld.people["viewer"])
    state = await receive_snapshot(communicator)
    assert state["log"] == ["loading θ_in ckpt", "step 10: loss=1.8", "step 20: loss=1.5"]

    def report() -> None:
        job_report(job=job, progress=0.6, metrics_point={"step": 30, "loss": 1.3}, log_line="step 30: loss=1.3")
        job_report(job=job, log_line="saving")

    await database_sync_to_async(report)()
    for event in await drain(communicator):
        assert event["event"] == LiveEvent.JOB_PROGRESS
        payload = event["payload"]
        if "progress" in payload:
            state["job"]["progress"] = payload["progress"]
        if "metrics_point" in payload:
            state["metrics_points"].append(payload["metrics_point"])
            state["job"]["metrics_last"] = {**state["job"]["metrics_last"], **payload["metrics_point"]}
        if "log_line" in payload:
            state["log"].append(payload["log_line"])
    fresh = lh.as_json(await database_sync_to_async(lambda: job_snapshot(job=type(job).objects.get(pk=job.pk)))())
    # updated_at-free fields only: the heartbeat is not an event of its own.
    assert state == fresh
    assert state["job"]["progress"] == 0.6
    assert state["log"][-2:] == ["step 30: loss=1.3", "saving"]
    await communicator.disconnect()


async def test_a_burst_of_events_is_batched_in_order(tworld):
    job = tworld.jobs["running"]
    communicator = await open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["viewer"])
    await receive_snapshot(communicator)

    def burst() -> None:
        # The job engine's high-rate path: one job.progress per report.
        for n in range(50):
            job_report(job=job, progress=n / 50)

    await database_sync_to_async(burst)()
    messages = []
    while not await communicator.receive_nothing(timeout=QUIET_SECONDS, interval=0.02):
        messages.append(await communicator.receive_json_from(timeout=5))
    events = [e for m in messages for e in m["events"]]
    progress = [e["payload"]["progress"] for e in events if e["event"] == LiveEvent.JOB_PROGRESS]
    assert progress == [n / 50 for n in range(50)]  # every event, in order
    assert len(messages) < 50  # fewer websocket messages than events
    await communicator.disconnect()


async def test_an_idle_socket_stays_subscribed(tworld):
    """channels_redis waits for messages with a 5 s BZPOPMIN; a Redis client read timeout at or
    under that kills idle consumers (redis-py 8 defaults to 5 s). Idle past it, then publish."""
    communicator = await open_socket(f"/ws/runs/{tworld.run.uuid}/", user=tworld.people["viewer"])
    await receive_snapshot(communicator)
    assert await communicator.receive_nothing(timeout=12, interval=0.5)

    await database_sync_to_async(guidance_post)(run=tworld.run, author=tworld.people["operator"], text="still there?")

    assert (await next_event(communicator))["event"] == LiveEvent.GUIDANCE_CREATED
    await communicator.disconnect()
