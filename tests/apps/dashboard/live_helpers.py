"""Helpers of the live tests: the event reducer the browser runs, in Python, and a run socket.

``apply_run_event`` follows static/dashboard/live.js ``applyRunEvent`` rule for rule; the
browser tests check the JavaScript itself against a fresh snapshot, these check the server's
half of the contract (snapshot shape, event payloads, ordering) without a browser.

Nothing here publishes: every event a test sees comes from the service that changed the state
(STYLE.md 31a). The socket helpers speak the consumer's protocol (apps/dashboard/consumers.py)
through the whole ASGI application and the real channels_redis layer.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.core.serializers.json import DjangoJSONEncoder
from django.test import Client

from rsiweb.asgi import application

COLLECTIONS = {
    "node": "nodes",
    "edge": "edges",
    "decision": "decisions",
    "experiment": "experiments",
    "guidance": "guidance",
    "report": "reports",
    "job": "jobs",
}
ORIGIN = (b"origin", b"http://127.0.0.1")
QUIET_SECONDS = 1.0


def as_json(value: Any) -> Any:
    """What the browser holds: the value after the websocket's JSON encoding."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def key_of(entity: str, record: dict[str, Any]) -> str | None:
    """live.js keyOf: an edge by its two ends, everything else by uuid."""
    if entity == "edge":
        return f"{record['source']}>{record['target']}" if record.get("source") and record.get("target") else None
    return record.get("uuid")


def run_state(snapshot: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = {"run": copy.deepcopy(snapshot["run"])}
    for entity, collection in COLLECTIONS.items():
        state[collection] = {key_of(entity, record): copy.deepcopy(record) for record in snapshot[collection]}
    return state


def apply_run_event(state: dict[str, Any], event: str, payload: dict[str, Any]) -> None:
    entity = event.split(".", 1)[0]
    if entity == "run":
        state["run"].update(payload)
        return
    collection = COLLECTIONS.get(entity)
    if collection is None:
        return  # an event the run page does not show (prediction.*, evaluation.*)
    key = key_of(entity, payload)
    if not key:
        return
    record = state[collection].get(key)
    if event == "job.progress":
        if record is None:
            return
        if "progress" in payload:
            record["progress"] = payload["progress"]
        if payload.get("metrics_point"):
            record["metrics_last"] = {**record.get("metrics_last", {}), **payload["metrics_point"]}
        return
    if record is None:
        state[collection][key] = dict(payload)
    else:
        record.update(payload)


# --- the run socket, as a browser holds it ----------------------------------------------------


def session_cookie(user: Any) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def open_socket(
    path: str, user: Any = None, headers: list[tuple[bytes, bytes]] | None = None
) -> WebsocketCommunicator:
    all_headers = [ORIGIN, *(headers or [])]
    if user is not None:
        all_headers.append((b"cookie", await database_sync_to_async(session_cookie)(user)))
    communicator = WebsocketCommunicator(application, path, headers=all_headers)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    return communicator


async def receive_snapshot(communicator: WebsocketCommunicator) -> dict[str, Any]:
    """Receive the snapshot's begin, parts and end (the consumer's protocol) and reassemble it."""
    begin = await communicator.receive_json_from(timeout=10)
    assert begin["type"] == "snapshot.begin", begin
    snapshot = begin["data"]
    while (message := await communicator.receive_json_from(timeout=10))["type"] == "snapshot.part":
        snapshot[message["key"]].extend(message["records"])
    assert message == {"type": "snapshot.end"}
    return snapshot


async def drain(communicator: WebsocketCommunicator, quiet: float = QUIET_SECONDS) -> list[dict[str, Any]]:
    """Every event ({"event", "payload"}) until no message arrives for ``quiet`` seconds."""
    events = []
    # receive_nothing rather than a receive that times out: asgiref's timeout cancels the
    # consumer, and under anyio the cancellation reaches the test itself.
    while not await communicator.receive_nothing(timeout=quiet, interval=0.02):
        message = await communicator.receive_json_from(timeout=5)
        assert message["type"] == "events", message
        events.extend(message["events"])
    return events


async def next_event(communicator: WebsocketCommunicator) -> dict[str, Any]:
    """The first event of the next message (an event that finds the socket idle comes alone)."""
    message = await communicator.receive_json_from(timeout=10)
    assert message["type"] == "events", message
    return message["events"][0]
