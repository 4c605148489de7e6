"""The one Celery app: three queues, explicit routes (STYLE.md 17)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from celery import Celery
from kombu import Queue as KombuQueue

from apps.core.queues import TASK_ROUTES, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rsiweb.settings.base")

app = Celery("rsiweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = tuple(KombuQueue(name.value) for name in Queue)
app.conf.task_default_queue = Queue.DEFAULT.value
app.conf.task_routes = TASK_ROUTES
# workers/ is not a Django app, so its task modules are named explicitly.
app.autodiscover_tasks(packages=["workers.gpu", "workers.agents", "workers.data"], related_name="tasks")


def _guard_detached_redis_channel() -> None:
    """A closed broker connection's channel raises a connection error, not AttributeError.

    Celery 5.7's consumer, on losing the broker, calls ``connection.collect()`` (which detaches the
    transport: ``transport.client = None``, but leaves the default channel open when draining its
    dead socket fails) and then ``connection.close()`` (celery/celery#9705, the reconnect fix in
    celery/celery#10242). That close closes the channel again; with unacknowledged messages
    (a running task, a countdown message held) the channel restores them, builds a new Redis pool
    from the detached transport and dies in ``Channel._connparams``: "'NoneType' object has no
    attribute 'hostname'" (the same AttributeError as celery/kombu#582), which Celery's
    ``ignore_errors`` does not catch, so the worker exits ("Unrecoverable error"). An idle worker
    has nothing to restore and survives, which is why this hid for so long.

    Raised as a Redis connection error instead, the close is ignored like any other on a dead
    connection and the consumer reconnects. The messages it could not restore are not lost work:
    every job, agent step and supervisor tick is re-sent from the database (apps.jobs.services,
    apps.research.agent_loops), and a copy that survived in Redis is claimed at most once.
    tests/faults/test_broker_held.py kills Redis under a worker holding messages.
    """
    from kombu.transport import redis as kombu_redis  # noqa: PLC0415 - only where Redis is the broker
    from redis.exceptions import ConnectionError as RedisConnectionError  # noqa: PLC0415

    original = kombu_redis.Channel._connparams  # type: ignore[attr-defined]
    if getattr(original, "_rsiweb_guarded", False):
        return

    def _connparams(self, asynchronous=False):  # type: ignore[no-untyped-def]
        if self.connection is None or self.connection.client is None:
            raise RedisConnectionError("the broker connection of this channel is already closed")
        return original(self, asynchronous=asynchronous)

    _connparams._rsiweb_guarded = True  # type: ignore[attr-defined]
    kombu_redis.Channel._connparams = _connparams  # type: ignore[attr-defined]


_guard_detached_redis_channel()


@dataclass(frozen=True)
class BrokerSnapshot:
    """What the broker holds now: its identity (Redis's ``run_id``, new at every start of the
    server) and the task ids of the messages waiting in the queues read or taken by a worker and
    not yet acknowledged (kombu's ``unacked`` hash)."""

    server: str
    task_ids: frozenset[str]


def _task_id(payload: dict[str, Any]) -> str:
    return str(payload.get("headers", {}).get("id") or payload.get("properties", {}).get("correlation_id") or "")


def _broker_connection() -> Any:
    """A kombu connection from the app's pool (reused: the reaper asks every sweep)."""
    return app.pool.acquire(block=True)


def broker_snapshot(queues: Iterable[str]) -> BrokerSnapshot | None:
    """Read the broker's messages of ``queues``; None unless the broker is Redis (the embedded
    SQLite broker lives and dies with the one machine's processes)."""
    with _broker_connection() as connection:
        if connection.transport.driver_type != "redis":
            return None
        channel = connection.default_channel
        client = channel.client
        server = str(client.info("server")["run_id"])
        ids: set[str] = set()
        for queue in queues:
            for priority in channel.priority_steps:
                for raw in client.lrange(channel._q_for_pri(queue, priority), 0, -1):
                    ids.add(_task_id(json.loads(raw)))
        for raw in client.hvals(channel.unacked_key):
            ids.add(_task_id(json.loads(raw)[0]))
    return BrokerSnapshot(server=server, task_ids=frozenset(ids - {""}))


def broker_server_id() -> str | None:
    """The broker's identity now (Redis's ``run_id``: new at every start); None unless Redis."""
    with _broker_connection() as connection:
        if connection.transport.driver_type != "redis":
            return None
        return str(connection.default_channel.client.info("server")["run_id"])
