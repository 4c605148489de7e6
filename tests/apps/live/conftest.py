"""Fixtures for the live-update tests: async tests run on asyncio through anyio's pytest plugin."""

from __future__ import annotations

import asyncio

import pytest

from apps.live.layers import SQLiteChannelLayer


@pytest.fixture
def anyio_backend():
    # Channels layers are asyncio code (asyncio.Queue, to_thread, redis.asyncio).
    return "asyncio"


@pytest.fixture
def make_layer(tmp_path):
    """SQLite layers on one file per test; sweeps on every call so expiry tests need no waiting."""
    path = tmp_path / "channels.sqlite3"

    def make(**config):
        config.setdefault("sweep_interval", 0)
        config.setdefault("poll_interval", 0.01)
        return SQLiteChannelLayer(path=str(path), **config)

    make.path = path
    return make


async def received_within(layer, channel, seconds=0.15):
    """The next message on a channel, or None when none arrives within `seconds`."""
    try:
        return await asyncio.wait_for(layer.receive(channel), seconds)
    except TimeoutError:
        return None
