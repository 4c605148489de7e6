"""A group_send from another process (a Celery worker, say) reaches a receiver in this one.

Run against both layers the settings can choose: our SQLite layer (embedded default) and
channels_redis (our subclass) on the real Redis (production, integration tests).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid

import pytest
from django.conf import settings
from django.utils.module_loading import import_string

pytestmark = pytest.mark.anyio

# The sending process: builds its own layer from the same backend and config, as a worker
# process would from settings, and sends one event carrying its pid.
SENDER = """
import asyncio, json, os, sys
from django.utils.module_loading import import_string

backend, config, group = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]

async def main():
    layer = import_string(backend)(**config)
    await layer.group_send(group, {"type": "live.event", "event": "run.updated", "payload": {"pid": os.getpid()}})

asyncio.run(main())
"""


def _sqlite(tmp_path):
    return "apps.live.layers.SQLiteChannelLayer", {"path": str(tmp_path / "channels.sqlite3")}


def _redis(tmp_path):
    # A prefix of our own, so flush() at the end clears only this test's keys.
    return "apps.live.layers.RedisChannelLayer", {
        "hosts": [settings.REDIS_URL],
        "prefix": f"rsitest-{uuid.uuid4().hex[:8]}",
    }


@pytest.mark.parametrize("backend_config", [_sqlite, _redis], ids=["sqlite", "redis"])
async def test_group_send_from_another_process_reaches_a_waiting_receiver(tmp_path, backend_config):
    backend, config = backend_config(tmp_path)
    layer = import_string(backend)(**config)
    group = f"run-{uuid.uuid4()}"
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    waiting = asyncio.create_task(layer.receive(channel))
    try:
        sender = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            SENDER,
            backend,
            json.dumps(config),
            group,
            cwd=str(settings.BASE_DIR),
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(sender.communicate(), 30)
        assert sender.returncode == 0, stderr.decode()

        message = await asyncio.wait_for(waiting, 10)

        assert message == {"type": "live.event", "event": "run.updated", "payload": {"pid": sender.pid}}
        assert sender.pid != os.getpid()
    finally:
        waiting.cancel()
        await layer.flush()
        if hasattr(layer, "close_pools"):
            await layer.close_pools()
