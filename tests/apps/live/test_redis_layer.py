"""Our channels_redis layer (apps.live.layers.RedisChannelLayer): a cancelled receive always ends,
and messages taken from Redis in batches still reach each channel once, in order.

channels_redis's own receive, on Python 3.11 with a socket timeout, loses a cancellation that
lands while redis-py opens the connection (asyncio.wait_for, CPython gh-86296) and then waits on
BZPOPMIN forever; a websocket consumer closed right after it opened never ended, and neither did
the event loop that ran it.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels_redis.core import RedisChannelLayer as ChannelsRedisLayer
from django.conf import settings

from apps.live.layers import RedisChannelLayer

pytestmark = pytest.mark.anyio


def _config() -> dict:
    # As in settings (a socket timeout, which makes redis-py send through wait_for), with a
    # prefix of our own so flush() clears only this test's keys.
    return {
        "hosts": [{"address": settings.REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5}],
        "prefix": f"rsitest-{uuid.uuid4().hex[:8]}",
    }


async def _receives_left_running(layer_class: type) -> list[int]:
    """Cancel a receive on a fresh layer after 0, 1, 2... loop turns; the turns after which it ran on."""
    left_running = []
    for turns in range(40):
        layer = layer_class(**_config())
        receiving = asyncio.ensure_future(layer.receive(await layer.new_channel()))
        for _ in range(turns):
            await asyncio.sleep(0)
        receiving.cancel()
        await asyncio.wait({receiving}, timeout=1)
        if not receiving.done():
            left_running.append(turns)
            while not receiving.done():  # stop it for good, so the test's loop can close
                receiving.cancel()
                await asyncio.wait({receiving}, timeout=0.2)
        await layer.flush()
    return left_running


async def test_a_cancelled_receive_ends_whenever_the_cancellation_lands():
    assert await _receives_left_running(RedisChannelLayer) == []


async def test_the_upstream_layer_loses_cancellations_this_guards_against():
    """Documents why the subclass exists; when it fails, the upstream bug is gone (Python 3.12+,
    or redis-py no longer sending through wait_for) and the subclass can go too."""
    assert await _receives_left_running(ChannelsRedisLayer) != []


async def test_receive_still_delivers_group_messages_in_order():
    layer = RedisChannelLayer(**_config())
    channel = await layer.new_channel()
    await layer.group_add("run-x", channel)
    waiting = asyncio.ensure_future(layer.receive(channel))
    await layer.group_send("run-x", {"type": "live.event", "n": 1})
    await layer.group_send("run-x", {"type": "live.event", "n": 2})
    assert await asyncio.wait_for(waiting, 5) == {"type": "live.event", "n": 1}
    assert await asyncio.wait_for(layer.receive(channel), 5) == {"type": "live.event", "n": 2}
    await layer.flush()


async def test_batched_receive_gives_each_channel_its_messages_once_in_order():
    """More messages than one batch, for three sockets of one process, sent directly and to groups
    (one group message is one Redis entry for all the process's members)."""
    layer = RedisChannelLayer(**_config(), capacity=1000)
    a, b, c = [await layer.new_channel() for _ in range(3)]
    await layer.group_add("run-ab", a)
    await layer.group_add("run-ab", b)
    expected: dict[str, list] = {a: [], b: [], c: []}
    for n in range(260):
        if n % 3 == 0:
            await layer.group_send("run-ab", {"type": "live.event", "n": n})
            expected[a].append(n)
            expected[b].append(n)
        else:
            target = a if n % 3 == 1 else c
            await layer.send(target, {"type": "live.event", "n": n})
            expected[target].append(n)

    async def drain(channel: str) -> list:
        return [(await layer.receive(channel))["n"] for _ in expected[channel]]

    got = await asyncio.wait_for(asyncio.gather(drain(a), drain(b), drain(c)), 30)
    assert dict(zip((a, b, c), got, strict=True)) == expected
    # Nothing left over, nothing delivered twice.
    for channel in (a, b, c):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(layer.receive(channel), 0.3)
    await layer.flush()
