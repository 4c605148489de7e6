"""The fault suite's own servers: a restart or a crash keeps committed rows; Redis comes back."""

from __future__ import annotations

from django.db import connections

from apps.research.models import Run
from tests.factories import make_run


def test_committed_rows_survive_a_database_restart_and_a_crash(transactional_db, pg_cluster):
    run = make_run()

    connections.close_all()
    pg_cluster.restart()
    assert Run.objects.filter(pk=run.pk).exists()

    connections.close_all()
    pg_cluster.kill()
    pg_cluster.start()
    assert Run.objects.get(pk=run.pk).uuid == run.uuid


def test_redis_comes_back_after_a_crash_with_or_without_persistence(redis_server):
    redis_server.client().set("probe", "1")
    redis_server.kill()
    redis_server.start()
    assert redis_server.client().get("probe") is None  # no persistence: an empty broker

    redis_server.appendonly = True
    redis_server.restart()
    redis_server.client().set("probe", "2")
    redis_server.kill()
    redis_server.start()
    assert redis_server.client().get("probe") == b"2"
