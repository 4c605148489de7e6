"""Websocket consumers: a run's page and a job's page, live (STYLE.md 23).

Protocol, server to browser only (writes go through the pages' forms and the REST API):

- on connect, a snapshot read from the dashboard selectors, in parts: websocket servers cap a
  message (daphne at 1 MiB) and a 2,000-node run's snapshot is larger. First
  ``{"type": "snapshot.begin", "data": {...}}`` (the snapshot with every list empty), then
  ``{"type": "snapshot.part", "key": "nodes", "records": [...]}`` per slice of each list, then
  ``{"type": "snapshot.end"}``; the browser applies the whole snapshot at the end;
- then ``{"type": "events", "events": [{"event": "node.created", "payload": {...}}, ...]}``
  carrying, in order, the live events the services publish to the group after their
  transactions commit. An event that finds the socket idle goes out at once, alone; events
  that arrive while one was just sent wait up to BATCH_WINDOW and share a message, so a busy
  run (hundreds of events a second) costs one websocket frame per window, not per event.

Nothing else reaches the socket between ``snapshot.begin`` and ``snapshot.end``: a consumer
handles one message at a time, and the snapshot is sent inside the connect handler.

The consumer joins the group *before* it reads the snapshot, so nothing committed after the
read is missed; an event already contained in the snapshot arrives once more and is harmless,
because applying a record to a state that has it changes nothing. A browser that reconnects
gets a fresh snapshot and replaces its state with it: that is the whole resynchronisation.

Close codes: 4401 not signed in (agent tokens never are: they have no session), 4403 signed in
without the right to watch this run, 4404 no such run or job.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.core.serializers.json import DjangoJSONEncoder

from apps.dashboard.permissions import can_view, can_view_run
from apps.dashboard.selectors import job_get_by_uuid, job_snapshot, run_get, run_snapshot
from apps.live.groups import job_group, run_group

# Records per snapshot part: a few hundred KB of JSON at most, far below servers' message caps.
SNAPSHOT_PART_RECORDS = 500
# How long events gather after a send before the next one; adds at most this to a busy socket's
# latency (the target is p95 < 150 ms at 500 events/s).
BATCH_WINDOW = 0.02
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404


class _LiveConsumer(AsyncJsonWebsocketConsumer):
    """Join one group after an access check, send a snapshot, forward the group's live events."""

    group_name: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: list[dict[str, Any]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            # Accept then close with a code, so the browser learns why (a refused handshake
            # shows only as 1006); nothing is sent before the close.
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        found = await self.authorise(user)
        if found is not True:
            await self.accept()
            await self.close(code=found)
            return
        await self.channel_layer.group_add(self.group_name, self.channel_name)
        await self.accept()
        await self.send_snapshot(await self.snapshot())

    async def send_snapshot(self, snapshot: dict[str, Any]) -> None:
        lists = {key: value for key, value in snapshot.items() if isinstance(value, list)}
        await self.send_json({"type": "snapshot.begin", "data": {**snapshot, **{key: [] for key in lists}}})
        for key, records in lists.items():
            for start in range(0, len(records), SNAPSHOT_PART_RECORDS):
                part = records[start : start + SNAPSHOT_PART_RECORDS]
                await self.send_json({"type": "snapshot.part", "key": key, "records": part})
        await self.send_json({"type": "snapshot.end"})

    async def disconnect(self, code: int) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        if self.group_name is not None:
            await self.channel_layer.group_discard(self.group_name, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # Browsers only listen; a message from one is ignored rather than treated as a command.
        return

    async def live_event(self, message: dict[str, Any]) -> None:
        """A ``live.event`` from apps.live.events.publish_on_commit, passed on as it is (batched)."""
        self._pending.append({"event": message["event"], "payload": message["payload"]})
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self.send_json({"type": "events", "events": batch})
                # Let the next events gather; with none, the loop ends and the next one goes at once.
                await asyncio.sleep(BATCH_WINDOW)
        finally:
            self._flusher = None

    @classmethod
    async def encode_json(cls, content: Any) -> str:
        # Snapshots hold datetimes; DjangoJSONEncoder spells them as publish_on_commit does.
        return json.dumps(content, cls=DjangoJSONEncoder, separators=(",", ":"))

    async def authorise(self, user: Any) -> bool | int:
        raise NotImplementedError

    async def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError


class RunConsumer(_LiveConsumer):
    """``ws/runs/<uuid>/``: the run page — run status, research DAG, experiments, guidance, jobs."""

    run: Any = None

    async def authorise(self, user: Any) -> bool | int:
        return await database_sync_to_async(self._authorise)(user)

    def _authorise(self, user: Any) -> bool | int:
        self.run = run_get(self.scope["url_route"]["kwargs"]["run_uuid"])
        if self.run is None:
            return CLOSE_NOT_FOUND
        if not can_view_run(user, self.run):
            return CLOSE_FORBIDDEN
        self.group_name = run_group(self.run.uuid)
        return True

    async def snapshot(self) -> dict[str, Any]:
        return await database_sync_to_async(self._snapshot)()

    def _snapshot(self) -> dict[str, Any]:
        # Re-read the run: the row fetched at authorisation may be older than the group join.
        return run_snapshot(run=run_get(self.run.uuid))


class JobConsumer(_LiveConsumer):
    """``ws/jobs/<uuid>/``: one job's progress, metrics and log tail."""

    job: Any = None

    async def authorise(self, user: Any) -> bool | int:
        return await database_sync_to_async(self._authorise)(user)

    def _authorise(self, user: Any) -> bool | int:
        self.job = job_get_by_uuid(self.scope["url_route"]["kwargs"]["job_uuid"])
        if self.job is None:
            return CLOSE_NOT_FOUND
        # A job of a run is watched like its run; a job outside any run (a datapool job) by any viewer.
        allowed = can_view_run(user, self.job.run) if self.job.run_id else can_view(user)
        if not allowed:
            return CLOSE_FORBIDDEN
        self.group_name = job_group(self.job.uuid)
        return True

    async def snapshot(self) -> dict[str, Any]:
        return await database_sync_to_async(self._snapshot)()

    def _snapshot(self) -> dict[str, Any]:
        return job_snapshot(job=job_get_by_uuid(self.job.uuid))
