"""Publishing live events to browsers, after the transaction that caused them commits.

Only services publish (STYLE.md 25). Every event reaches consumers as the channel-layer message
``{"type": "live.event", "event": "<dotted.type>", "payload": {...}}``, handled by a consumer's
``live_event`` method. The event type is dotted, ``<entity>.<what happened>``: ``run.updated``,
``node.created``, ``experiment.updated``, ``job.progress``, ``guidance.applied``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
from typing import Any

from channels.layers import get_channel_layer
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction

logger = logging.getLogger(__name__)

LIVE_EVENT_TYPE = "live.event"
_EVENT_TYPE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
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


def publish_on_commit(group: str, event_type: str, payload: dict[str, Any]) -> None:
    """Send a live event to a group once the current transaction commits; nothing if it rolls back.

    The payload is turned into plain JSON now (UUIDs, datetimes and decimals become strings), so
    a later change to the caller's dict does not leak into the event and consumers can forward
    it to the browser as is. Bad arguments raise here, in the caller; a channel layer that is
    down is logged and never raises, because a live update is not worth the caller's work.
    """
    if not _EVENT_TYPE.match(event_type):
        raise ValueError(f"event type {event_type!r} must be dotted lower-case, e.g. 'run.updated'")
    if not _GROUP_NAME.match(group):
        raise ValueError(f"group {group!r} is not a channel-layer group name; build it with apps.live.groups")
    message = {
        "type": LIVE_EVENT_TYPE,
        "event": event_type,
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
