"""The SQLite channel layer keeps the Channels layer contract (InMemoryChannelLayer's behaviour)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from channels.exceptions import ChannelFull

from tests.apps.live.conftest import received_within

pytestmark = pytest.mark.anyio


async def test_send_then_receive_returns_messages_in_order_as_copies(make_layer):
    layer = make_layer()
    original = {"type": "test.message", "text": "hé", "raw": b"\x00\xff", "n": [1, 2]}

    await layer.send("worker.jobs", original)
    await layer.send("worker.jobs", {"type": "test.message", "n": 2})
    original["n"].append(3)

    assert await layer.receive("worker.jobs") == {"type": "test.message", "text": "hé", "raw": b"\x00\xff", "n": [1, 2]}
    assert await layer.receive("worker.jobs") == {"type": "test.message", "n": 2}
    assert await received_within(layer, "worker.jobs") is None


async def test_receive_waits_for_a_message_sent_later(make_layer):
    layer = make_layer()
    channel = await layer.new_channel()
    waiting = asyncio.create_task(layer.receive(channel))
    await asyncio.sleep(0.05)

    await layer.send(channel, {"type": "late"})

    assert await asyncio.wait_for(waiting, 2) == {"type": "late"}


async def test_new_channel_names_are_valid_unique_and_specific(make_layer):
    layer = make_layer()

    names = {await layer.new_channel() for _ in range(20)}

    assert len(names) == 20
    for name in names:
        assert "!" in name
        assert layer.require_valid_channel_name(name)


async def test_invalid_names_are_refused(make_layer):
    layer = make_layer()

    with pytest.raises(TypeError):
        await layer.send("bad channel", {"type": "x"})
    with pytest.raises(TypeError):
        await layer.send("a" * 100, {"type": "x"})
    with pytest.raises(TypeError):
        await layer.group_add("bad/group", "chan")
    with pytest.raises(TypeError):
        await layer.group_send("é", {"type": "x"})
    with pytest.raises(AssertionError):
        await layer.send("chan", ["not", "a", "dict"])


async def test_group_send_reaches_members_until_they_leave(make_layer):
    layer = make_layer()
    first, second = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("run-1", first)
    await layer.group_add("run-1", second)
    await layer.group_add("run-1", second)  # joining twice is one membership

    await layer.group_send("run-1", {"type": "live.event", "n": 1})
    await layer.group_discard("run-1", first)
    await layer.group_send("run-1", {"type": "live.event", "n": 2})

    assert await layer.receive(first) == {"type": "live.event", "n": 1}
    assert await received_within(layer, first) is None
    assert await layer.receive(second) == {"type": "live.event", "n": 1}
    assert await layer.receive(second) == {"type": "live.event", "n": 2}
    assert await received_within(layer, second) is None


async def test_group_send_to_an_empty_group_is_a_no_op(make_layer):
    layer = make_layer()

    await layer.group_send("nobody-here", {"type": "x"})
    await layer.group_discard("nobody-here", "specific.sqlite!abc")


async def test_expired_messages_are_not_delivered_and_drop_their_channel_from_groups(make_layer):
    layer = make_layer(expiry=0.2)
    listener, other = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("run-1", listener)
    await layer.group_add("run-1", other)
    await layer.send(listener, {"type": "stale"})

    await asyncio.sleep(0.3)
    await layer.group_send("run-1", {"type": "fresh"})

    # The listener let a message expire, so it counts as gone: it got neither the stale message
    # nor the group message sent after; the other member still gets the group message.
    assert await received_within(layer, listener) is None
    assert await layer.receive(other) == {"type": "fresh"}


async def test_group_memberships_expire(make_layer):
    layer = make_layer(group_expiry=0.2)
    channel = await layer.new_channel()
    await layer.group_add("run-1", channel)

    await asyncio.sleep(0.3)
    await layer.group_send("run-1", {"type": "x"})

    assert await received_within(layer, channel) is None


async def test_capacity_raises_channel_full_and_group_send_skips_full_channels(make_layer):
    layer = make_layer(capacity=2, channel_capacity={"big.*": 3})
    await layer.send("small", {"n": 1})
    await layer.send("small", {"n": 2})
    with pytest.raises(ChannelFull):
        await layer.send("small", {"n": 3})
    for n in range(3):
        await layer.send("big.one", {"n": n})
    with pytest.raises(ChannelFull):
        await layer.send("big.one", {"n": 3})
    await layer.group_add("run-1", "small")
    await layer.group_add("run-1", "roomy")

    await layer.group_send("run-1", {"n": "group"})

    assert [(await layer.receive("small"))["n"] for _ in range(2)] == [1, 2]
    assert await received_within(layer, "small") is None
    assert await layer.receive("roomy") == {"n": "group"}


async def test_flush_empties_channels_and_groups(make_layer):
    layer = make_layer()
    await layer.send("chan", {"type": "x"})
    await layer.group_add("run-1", "member")

    await layer.flush()
    await layer.group_send("run-1", {"type": "y"})

    assert await received_within(layer, "chan") is None
    assert await received_within(layer, "member") is None


async def test_racing_receivers_on_separate_connections_get_each_message_once(make_layer):
    # Separate layer instances have separate connections: the same SQLite locking as separate
    # processes, without process start-up on a 2-core box.
    layers = [make_layer(poll_interval=0.001) for _ in range(3)]
    sent = [{"n": n} for n in range(60)]
    got = []

    async def drain(layer):
        while (message := await received_within(layer, "shared", seconds=0.5)) is not None:
            got.append(message["n"])

    receivers = [asyncio.create_task(drain(layer)) for layer in layers for _ in range(2)]
    for message in sent:
        await layers[0].send("shared", message)
    await asyncio.gather(*receivers)

    assert sorted(got) == list(range(60))


async def test_a_receive_cancelled_while_claiming_puts_the_message_back(make_layer):
    layer = make_layer()
    await layer.send("chan", {"type": "kept"})
    # Another process holding the write lock stalls the claim after it has seen the message.
    blocker = sqlite3.connect(make_layer.path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(layer.receive("chan"), 0.2)
    finally:
        # The stalled claim now takes the message for a receiver that is gone.
        blocker.execute("ROLLBACK")
        blocker.close()
    # Let it finish (SQLite's busy handler naps up to 100 ms between tries) before asking
    # again, or a fresh receive could win the lock and take the message first.
    await asyncio.sleep(0.5)

    assert await received_within(layer, "chan", seconds=2) == {"type": "kept"}
