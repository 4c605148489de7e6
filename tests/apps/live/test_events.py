"""publish_on_commit: events leave only after a commit, in one shape, and never break the caller.

These test the publisher itself, so they call it; a test of what a page shows drives the services
that publish instead (STYLE.md 31a).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import override_settings

from apps.live import events
from apps.live.events import LiveEvent, publish_on_commit
from apps.live.groups import run_group
from apps.live.layers import SQLiteChannelLayer
from tests.apps.live.conftest import received_within


def _failing_service(group, event_type, payload):
    """A service that publishes, then fails inside its own atomic block."""
    with transaction.atomic():
        publish_on_commit(group, event_type, payload)
        raise RuntimeError("the service failed")


@pytest.fixture
def listener(tmp_path):
    """A receiver on a run group, on the SQLite layer that CHANNEL_LAYERS points the app at."""
    path = str(tmp_path / "channels.sqlite3")
    layer = SQLiteChannelLayer(path=path, poll_interval=0.01)
    group = run_group(uuid.uuid4())
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    config = {"default": {"BACKEND": "apps.live.layers.SQLiteChannelLayer", "CONFIG": {"path": path}}}
    with override_settings(CHANNEL_LAYERS=config):
        yield group, lambda seconds=0.15: async_to_sync(received_within)(layer, channel, seconds)


@pytest.mark.django_db(transaction=True)
def test_event_is_sent_after_commit_not_before(listener):
    group, next_message = listener
    run_uuid = uuid.uuid4()
    at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)

    with transaction.atomic():
        publish_on_commit(group, LiveEvent.RUN_UPDATED, {"run": run_uuid, "at": at, "status": "running"})
        assert next_message() is None

    assert next_message(seconds=5) == {
        "type": "live.event",
        "event": "run.updated",
        "payload": {"run": str(run_uuid), "at": "2026-01-02T03:04:05Z", "status": "running"},
    }


@pytest.mark.django_db(transaction=True)
def test_rolled_back_transaction_sends_nothing(listener):
    group, next_message = listener

    with pytest.raises(RuntimeError):
        _failing_service(group, LiveEvent.NODE_CREATED, {"node": "n1"})

    assert next_message(seconds=0.5) is None


@pytest.mark.django_db(transaction=True)
def test_rolled_back_savepoint_drops_only_its_own_event(listener):
    group, next_message = listener

    with transaction.atomic():
        publish_on_commit(group, LiveEvent.EXPERIMENT_UPDATED, {"n": 1})
        with pytest.raises(RuntimeError):
            _failing_service(group, LiveEvent.EXPERIMENT_UPDATED, {"n": 2})

    assert next_message(seconds=5)["payload"] == {"n": 1}
    assert next_message() is None


@pytest.mark.django_db(transaction=True)
def test_a_layer_that_is_down_is_logged_and_the_commit_stands(caplog):
    # Nothing listens on port 1: the real redis client gets "connection refused".
    down = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}
    }

    with (
        override_settings(CHANNEL_LAYERS=down),
        caplog.at_level(logging.ERROR, logger="apps.live.events"),
        transaction.atomic(),
    ):
        get_user_model().objects.create(username="kept")
        publish_on_commit(run_group(uuid.uuid4()), LiveEvent.RUN_UPDATED, {})

    assert get_user_model().objects.filter(username="kept").exists()
    assert "run.updated" in caplog.text
    assert "not sent" in caplog.text


def test_bad_event_types_and_group_names_raise_in_the_caller():
    for undeclared in ("RunUpdated", "run.renamed"):
        with pytest.raises(ValueError, match="not declared"):
            publish_on_commit(run_group(uuid.uuid4()), undeclared, {})
    with pytest.raises(ValueError, match="group"):
        publish_on_commit("run/1", LiveEvent.RUN_UPDATED, {})


@pytest.mark.django_db(transaction=True)
def test_events_of_one_process_go_out_on_one_event_loop(listener):
    """Every send reuses the publisher's loop (and so the layer's connections), in order."""
    group, next_message = listener
    for n in range(5):
        publish_on_commit(group, LiveEvent.EXPERIMENT_UPDATED, {"n": n})
    loop = events._publisher._running_loop()
    publish_on_commit(group, LiveEvent.EXPERIMENT_UPDATED, {"n": 5})
    assert events._publisher._running_loop() is loop
    assert loop.is_running()
    assert [next_message(seconds=5)["payload"]["n"] for _ in range(6)] == [0, 1, 2, 3, 4, 5]
