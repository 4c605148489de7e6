"""Publishing live events to browsers, after the transaction that caused them commits.

Only services publish (STYLE.md 25). Every event reaches consumers as the channel-layer message
``{"type": "live.event", "event": "<dotted.type>", "payload": {...}}``, handled by a consumer's
``live_event`` method. The event types are declared once, in ``LiveEvent``: dotted,
``<entity>.<what happened>``, where the entity names the record the payload is (built by that
record's selector) and the browser merges it into the record with the same key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
from enum import StrEnum
from typing import Any

from channels.layers import get_channel_layer
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction

logger = logging.getLogger(__name__)

LIVE_EVENT_TYPE = "live.event"


class LiveEvent(StrEnum):
    """Every live event type; publishers and consumers name them only through this."""

    RUN_UPDATED = "run.updated"  # status, budget use, result: payload run_live (or a subset)
    NODE_CREATED = "node.created"  # a Worker or Reviewer joined the research DAG
    NODE_UPDATED = "node.updated"  # its status changed (finalized, abandoned)
    EDGE_CREATED = "edge.created"
    DECISION_CREATED = "decision.created"  # a Main Agent decision with its rationale
    PREDICTION_CREATED = "prediction.created"
    PREDICTION_UPDATED = "prediction.updated"  # bound to a Worker, or reconciled
    GUIDANCE_CREATED = "guidance.created"  # a person's guidance, pending
    GUIDANCE_UPDATED = "guidance.updated"  # applied (or read) by a planning step
    REPORT_CREATED = "report.created"  # a Reviewer report
    REPORT_UPDATED = "report.updated"
    EXPERIMENT_CREATED = "experiment.created"
    EXPERIMENT_UPDATED = "experiment.updated"  # status, feedback score, integrity status
    EVALUATION_CREATED = "evaluation.created"  # a recorded (or refused) evaluation
    JOB_UPDATED = "job.updated"  # a job's state machine moved
    JOB_PROGRESS = "job.progress"  # the high-rate subset: progress, a metrics point, a log line


_EVENT_TYPES = frozenset(LiveEvent)
_GROUP_NAME = re.compile(r"^[a-zA-Z0-9\-_.]{1,99}$")
# A send that has not finished by then is logged as lost (a layer that hangs, not one that is down).
SEND_TIMEOUT_SECONDS = 10.0


class _PublisherLoop:
    """One event loop per process, on a daemon thread, that every live event is sent from.

    ``async_to_sync`` from a plain thread runs each call on a new event loop, and channels_redis
    keeps its connections per loop: every live event opened a Redis connection and dropped it,
    which held a publishing process near 290 events/s. Sends are still synchronous for the
    caller (it waits for the result), so one thread's events keep their order. A forked child
    (Celery's prefork pool) starts its own loop.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="rsiweb-live-publisher", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def send(self, layer: Any, group: str, message: dict[str, Any]) -> None:
        future = asyncio.run_coroutine_threadsafe(layer.group_send(group, message), self._running_loop())
        try:
            future.result(timeout=SEND_TIMEOUT_SECONDS)
        except TimeoutError:
            future.cancel()  # it must not linger on the loop, or finish later out of order
            raise


_publisher = _PublisherLoop()


def publish_on_commit(group: str, event_type: LiveEvent, payload: dict[str, Any]) -> None:
    """Send a live event to a group once the current transaction commits; nothing if it rolls back.

    The payload is turned into plain JSON now (UUIDs, datetimes and decimals become strings), so
    a later change to the caller's dict does not leak into the event and consumers can forward
    it to the browser as is. Bad arguments raise here, in the caller; a channel layer that is
    down is logged and never raises, because a live update is not worth the caller's work.
    """
    if event_type not in _EVENT_TYPES:
        raise ValueError(f"event type {event_type!r} is not declared in apps.live.events.LiveEvent")
    if not _GROUP_NAME.match(group):
        raise ValueError(f"group {group!r} is not a channel-layer group name; build it with apps.live.groups")
    message = {
        "type": LIVE_EVENT_TYPE,
        "event": str(event_type),
        "payload": json.loads(json.dumps(payload, cls=DjangoJSONEncoder)),
    }

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            logger.warning("live event %s for %s dropped: no channel layer configured", event_type, group)
            return
        try:
            _publisher.send(layer, group, message)
        except Exception:
            # Browsers re-read a snapshot when they reconnect, so a lost event costs freshness,
            # not correctness; the committed work stays committed.
            logger.exception("live event %s for %s not sent: channel layer failed", event_type, group)

    # On commit: a browser told about a row must be able to read it (STYLE.md 10). Outside any
    # transaction Django runs this at once.
    transaction.on_commit(send)
