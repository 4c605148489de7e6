"""Our channel layers: channels_redis with a sturdier and faster receive, and a layer stored in
one SQLite file, so live updates cross processes with no server.

``RedisChannelLayer`` (production and the integration tests) is channels_redis's, changed in its
receive only, explained there: a cancelled receive could lose its cancellation and wait forever,
and one message per four Redis round trips was too slow for a busy run page.

``SQLiteChannelLayer``:

Why it exists: the embedded default (DESIGN.md, "Configuration") runs with nothing to install,
yet a Celery worker process must still reach the browser sockets held by the web process. The
in-memory layer stays inside one process, and no maintained SQLite channel layer exists, so
this is a small one of ours. Production and the integration tests use ``channels_redis``; this
layer keeps the same contract (``channels.layers.InMemoryChannelLayer`` is the reference:
name validation, per-channel capacity with ``ChannelFull``, message expiry that also drops the
channel from its groups, group membership expiry, the ``groups`` and ``flush`` extensions).

How: two tables in the file at ``CONFIG["path"]`` — queued messages (msgpack, like
channels_redis) and group memberships. WAL mode lets readers poll while a writer commits, and a
busy timeout makes writers from several processes queue instead of failing. Every SQLite call
runs in a worker thread (``asyncio.to_thread``), never on the event loop. A receive claims one
message by deleting it inside a ``BEGIN IMMEDIATE`` write transaction, so two receivers racing
on one channel — threads or processes — never both get it.

Limits: receive polls, so delivery latency is up to ``poll_interval`` (30 ms by default) plus a
few milliseconds (docs/benchmarks.md has the figures); each waiting receiver issues one
cheap indexed read per poll, which suits one machine and tens of open sockets, not thousands.
All writers share SQLite's one write lock. Use channels_redis wherever Redis exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgpack
from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer
from channels_redis.core import RedisChannelLayer as _ChannelsRedisLayer

T = TypeVar("T")

# Pops up to ARGV[1] messages of a channel's queue (KEYS[1]) into its in-flight copy (KEYS[2]), in
# queue order, and returns them.
_POP_TO_INFLIGHT = """
local popped = redis.call('ZPOPMIN', KEYS[1], ARGV[1])
local members = {}
for i = 1, #popped, 2 do
    redis.call('ZADD', KEYS[2], popped[i + 1], popped[i])
    members[#members + 1] = popped[i]
end
return members
"""
# How long a cancelled receive waits for its cancellation to land before cancelling again.
_RECANCEL_INTERVAL = 0.05


class RedisChannelLayer(_ChannelsRedisLayer):
    """channels_redis's layer, with a receive that ends when it is cancelled, always, and that
    takes the queued messages of this process's sockets in batches (``receive_single``).

    Why: on Python 3.11 ``asyncio.wait_for`` swallows a cancellation that arrives while the
    operation it waits for is completing (CPython bpo-42130 / gh-86296, fixed in 3.12 only). redis-py wraps
    every command it sends in ``wait_for`` when a socket timeout is set (we set one, see
    settings), and a receive that opens its connection sends half a dozen (HELLO, CLIENT
    SETINFO, SELECT...). A consumer cancelled then — a websocket closed right after it opened,
    a refused one, a server or test event loop shutting down — loses the cancellation, and
    channels_redis's receive goes back to waiting on BZPOPMIN, forever: the consumer task never
    ends, and whoever awaits it (``asyncio.run``'s shutdown, a test's ``disconnect()``) hangs.

    So the receive runs as a task of its own; when the caller is cancelled, that task is
    cancelled again every ``_RECANCEL_INTERVAL`` until it has ended (a cancellation that lands
    in a read or in BZPOPMIN is never lost), and the caller's CancelledError goes on. A message
    received in that instant is dropped, as it is by channels_redis itself: its consumer is
    going away.
    """

    # At most this many queued messages are taken from Redis per receive round (see receive_single).
    receive_batch = 100

    async def receive(self, channel: str) -> dict[str, Any]:
        receiving = asyncio.ensure_future(super().receive(channel))
        try:
            # shield: the caller's cancellation stops this await, not the receive; it is handled below.
            return await asyncio.shield(receiving)
        except asyncio.CancelledError:
            await _cancel_until_done(receiving)
            raise

    async def receive_single(self, channel: str) -> tuple[Any, Any]:
        """Take up to ``receive_batch`` queued messages of this process's channels in one round.

        Why: upstream takes one message per round of four Redis round trips (the in-flight
        clean-up script, BZPOPMIN, the in-flight copy, its removal), about 0.5 ms of CPU a
        message; a busy run page (hundreds of events a second) then outruns its web process on a
        loaded machine and the queue grows without bound (docs/benchmarks.md, issue 7). Here the
        round is the same, but after the blocking pop one script moves every further queued
        message to the in-flight copy and returns them (atomic on the server, so a receive
        cancelled while waiting for the reply leaves them in-flight, and the next round's clean-up
        puts them back, as upstream does for its one). Each message goes to its channels' local
        buffers in queue order, where channels_redis's receive() finds it; returning no channels
        tells receive() there is nothing more to place.

        Only the process-local key (``specific.<client>!``) is batched: its messages carry their
        full channel names. A plain channel keeps upstream's one message per receive.
        """
        if not channel.endswith("!"):
            return await super().receive_single(channel)
        assert self.require_valid_channel_name(channel, receive=True), "Channel name invalid"
        index = self.consistent_hash(channel)
        channel_key = self.prefix + channel
        await self.receive_clean_locks.acquire(channel_key)
        try:
            first = None
            while first is None:
                first = await self._brpop_with_clean(index, channel_key, timeout=self.brpop_timeout)
            rest = await self.connection(index).eval(
                _POP_TO_INFLIGHT, 2, channel_key, self._backup_channel_name(channel_key), self.receive_batch - 1
            )
            contents = [first, *rest]
            # As upstream: the in-flight copies go once the messages are in the local buffers; the
            # clean-up lock keeps the next round's script from re-queuing them before that.
            cleaner = asyncio.ensure_future(
                self.connection(index).zpopmin(self._backup_channel_name(channel_key), len(contents))
            )
            self.receive_cleaners.append(cleaner)

            def _cleanup_done(cleaner: asyncio.Future[Any]) -> None:
                self.receive_cleaners.remove(cleaner)
                self.receive_clean_locks.release(channel_key)

            cleaner.add_done_callback(_cleanup_done)
        except BaseException:
            self.receive_clean_locks.release(channel_key)
            raise
        for content in contents:
            message = self.deserialize(content)
            targets = message.pop("__asgi_channel__")
            for target in targets if isinstance(targets, list) else [targets]:
                self.receive_buffer[target].put_nowait(message)
        return [], None


async def _cancel_until_done(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` until it has ended, even if cancellations are lost or we are cancelled again."""
    while not task.done():
        task.cancel()
        try:
            await asyncio.wait({task}, timeout=_RECANCEL_INTERVAL)
        except asyncio.CancelledError:
            # Cancelled again while cleaning up: keep going; our caller re-raises its cancellation.
            continue
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved


_SCHEMA = """
CREATE TABLE IF NOT EXISTS channel_message (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL,
    expires REAL NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS channel_message_channel ON channel_message (channel, id);
CREATE INDEX IF NOT EXISTS channel_message_expires ON channel_message (expires);
CREATE TABLE IF NOT EXISTS channel_group (
    grp TEXT NOT NULL,
    channel TEXT NOT NULL,
    joined REAL NOT NULL,
    PRIMARY KEY (grp, channel)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS channel_group_channel ON channel_group (channel);
CREATE INDEX IF NOT EXISTS channel_group_joined ON channel_group (joined);
"""

# The oldest live message of a channel; the (channel, id) index serves it.
_NEXT_ID = "SELECT id FROM channel_message WHERE channel = ? AND expires >= ? ORDER BY id LIMIT 1"


class SQLiteChannelLayer(BaseChannelLayer):
    """Channel layer whose messages and groups live in a SQLite file shared by local processes."""

    extensions = ["groups", "flush"]

    def __init__(
        self,
        path: str,
        expiry: float = 60,
        group_expiry: float = 86400,
        capacity: int = 100,
        channel_capacity: dict[Any, int] | None = None,
        poll_interval: float = 0.03,
        busy_timeout: float = 10.0,
        sweep_interval: float = 1.0,
    ) -> None:
        super().__init__(expiry=expiry, capacity=capacity, channel_capacity=channel_capacity)
        # BaseChannelLayer stores the raw dict; get_capacity() expects compiled patterns.
        self.channel_capacity = self.compile_capacities(channel_capacity or {})
        self.path = str(path)
        self.group_expiry = group_expiry
        self.poll_interval = poll_interval
        self.busy_timeout = busy_timeout
        self.sweep_interval = sweep_interval
        self._next_sweep = 0.0
        # Idle connections, borrowed by whichever worker thread runs an operation. A pool rather
        # than one connection per thread: async_to_sync (Celery publishing) makes a new thread
        # per call, and per-thread connections would pile up.
        self._pool: list[sqlite3.Connection] = []
        self._pool_lock = threading.Lock()
        self._pool_pid = os.getpid()
        self._schema_ready = False

    # --- connections -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; writes take BEGIN IMMEDIATE explicitly.
        # check_same_thread=False: pooled connections move between threads, one at a time.
        con = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False)
        # Messages are transient: NORMAL survives a crashed process, only not a power cut.
        con.execute("PRAGMA synchronous=NORMAL")
        if not self._schema_ready:
            # WAL is a property of the file, so setting it once per process is enough; it lets
            # receivers poll while another process writes.
            con.execute("PRAGMA journal_mode=WAL")
            con.executescript(_SCHEMA)
            self._schema_ready = True
        return con

    @contextlib.contextmanager
    def _borrow(self) -> Iterator[sqlite3.Connection]:
        with self._pool_lock:
            if self._pool_pid != os.getpid():
                # Forked (Celery prefork): a SQLite connection must not cross fork, so the child
                # drops its parent's idle connections and opens its own.
                self._pool = []
                self._pool_pid = os.getpid()
            con = self._pool.pop() if self._pool else None
        if con is None:
            con = self._connect()
        try:
            yield con
        finally:
            with self._pool_lock:
                # A connection left inside a transaction (a failed ROLLBACK) is not reused.
                keep = not con.in_transaction and len(self._pool) < 8 and self._pool_pid == os.getpid()
                if keep:
                    self._pool.append(con)
            if not keep:
                con.close()

    @staticmethod
    @contextlib.contextmanager
    def _write(con: sqlite3.Connection) -> Iterator[None]:
        # IMMEDIATE takes the write lock at BEGIN (waiting up to the busy timeout), so a
        # read-then-write inside cannot be overtaken by another process's commit.
        con.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    async def _run(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._borrow() as con:
                return operation(con)

        return await asyncio.to_thread(call)

    # --- expiry ------------------------------------------------------------------------------

    def _sweep_if_due(self, con: sqlite3.Connection, now: float) -> None:
        """Drop expired messages and memberships, at most once per sweep_interval per process."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.sweep_interval
        stale_join = now - self.group_expiry
        due = con.execute(
            "SELECT EXISTS (SELECT 1 FROM channel_message WHERE expires < ?)"
            " OR EXISTS (SELECT 1 FROM channel_group WHERE joined < ?)",
            (now, stale_join),
        ).fetchone()[0]
        if not due:
            return
        with self._write(con):
            # As in the in-memory layer: a channel that let a message expire has no live reader,
            # so it leaves every group and stops collecting messages nobody will read.
            con.execute(
                "DELETE FROM channel_group WHERE channel IN (SELECT channel FROM channel_message WHERE expires < ?)",
                (now,),
            )
            con.execute("DELETE FROM channel_message WHERE expires < ?", (now,))
            con.execute("DELETE FROM channel_group WHERE joined < ?", (stale_join,))

    # --- channel layer API -------------------------------------------------------------------

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """Queue a message on a channel; raises ChannelFull when the channel is at capacity."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        body = msgpack.packb(message, use_bin_type=True)
        capacity = self.get_capacity(channel)

        def operation(con: sqlite3.Connection) -> None:
            now = time.time()
            # The count and the insert share one write transaction, so concurrent senders cannot
            # together push a channel past its capacity.
            with self._write(con):
                (queued,) = con.execute(
                    "SELECT COUNT(*) FROM channel_message WHERE channel = ? AND expires >= ?", (channel, now)
                ).fetchone()
                if queued >= capacity:
                    raise ChannelFull(channel)
                con.execute(
                    "INSERT INTO channel_message (channel, expires, body) VALUES (?, ?, ?)",
                    (channel, now + self.expiry, body),
                )

        await self._run(operation)

    def _claim(self, con: sqlite3.Connection, channel: str) -> tuple[int, float, bytes] | None:
        now = time.time()
        self._sweep_if_due(con, now)
        # Lock-free look first: an idle poll must not take the write lock every few milliseconds.
        if con.execute(_NEXT_ID, (channel, now)).fetchone() is None:
            return None
        with self._write(con):
            rows = con.execute(
                f"DELETE FROM channel_message WHERE id = ({_NEXT_ID}) RETURNING id, expires, body",
                (channel, now),
            ).fetchall()
        return rows[0] if rows else None

    def _put_back(self, con: sqlite3.Connection, channel: str, row: tuple[int, float, bytes]) -> None:
        with self._write(con):
            # Same id, so the message returns to the head of its channel's queue.
            con.execute(
                "INSERT OR IGNORE INTO channel_message (id, channel, expires, body) VALUES (?, ?, ?, ?)",
                (row[0], channel, row[1], row[2]),
            )

    def _put_back_in_thread(self, channel: str, row: tuple[int, float, bytes]) -> None:
        def run() -> None:
            with self._borrow() as con:
                self._put_back(con, channel, row)

        threading.Thread(target=run, name="sqlite-layer-put-back", daemon=True).start()

    async def _claim_once(self, channel: str) -> tuple[int, float, bytes] | None:
        # A cancelled receive (a socket closing, a loop shutting down) does not stop the thread
        # that is claiming for it. Whichever side learns second that the claimed message has no
        # taker puts it back, so a cancel never loses a message another receiver could have had.
        handoff_lock = threading.Lock()
        handoff: dict[str, Any] = {"cancelled": False, "row": None}

        def claim(con: sqlite3.Connection) -> tuple[int, float, bytes] | None:
            row = self._claim(con, channel)
            if row is None:
                return None
            with handoff_lock:
                if not handoff["cancelled"]:
                    handoff["row"] = row
                    return row
            self._put_back(con, channel, row)
            return None

        try:
            return await self._run(claim)
        except asyncio.CancelledError:
            with handoff_lock:
                handoff["cancelled"] = True
                row = handoff["row"]
            if row is not None:
                self._put_back_in_thread(channel, row)
            raise

    async def receive(self, channel: str) -> dict[str, Any]:
        """Wait for and return the oldest live message on a channel, polling every poll_interval."""
        self.require_valid_channel_name(channel)
        while True:
            row = await self._claim_once(channel)
            if row is not None:
                message: dict[str, Any] = msgpack.unpackb(row[2], raw=False)
                return message
            await asyncio.sleep(self.poll_interval)

    async def new_channel(self, prefix: str = "specific") -> str:
        """A fresh channel name for one consumer of this process."""
        return f"{prefix}.sqlite!{uuid.uuid4().hex}"

    # --- groups extension --------------------------------------------------------------------

    async def group_add(self, group: str, channel: str) -> None:
        """Add a channel to a group, or refresh its membership so it does not expire."""
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)

        def operation(con: sqlite3.Connection) -> None:
            con.execute(
                "INSERT INTO channel_group (grp, channel, joined) VALUES (?, ?, ?)"
                " ON CONFLICT (grp, channel) DO UPDATE SET joined = excluded.joined",
                (group, channel, time.time()),
            )

        await self._run(operation)

    async def group_discard(self, group: str, channel: str) -> None:
        self.require_valid_channel_name(channel)
        self.require_valid_group_name(group)

        def operation(con: sqlite3.Connection) -> None:
            con.execute("DELETE FROM channel_group WHERE grp = ? AND channel = ?", (group, channel))

        await self._run(operation)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Queue a message on every member channel; full channels miss it, as in every layer."""
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        body = msgpack.packb(message, use_bin_type=True)

        def operation(con: sqlite3.Connection) -> None:
            now = time.time()
            self._sweep_if_due(con, now)
            # One write transaction for the whole group: members see the message together and the
            # capacity counts cannot go stale between the check and the insert.
            with self._write(con):
                members = [
                    channel
                    for (channel,) in con.execute(
                        "SELECT channel FROM channel_group WHERE grp = ? AND joined >= ?",
                        (group, now - self.group_expiry),
                    )
                ]
                if not members:
                    return
                queued = dict(
                    con.execute(
                        "SELECT m.channel, COUNT(*) FROM channel_message AS m"
                        " JOIN channel_group AS g ON g.channel = m.channel AND g.grp = ?"
                        " WHERE m.expires >= ? GROUP BY m.channel",
                        (group, now),
                    ).fetchall()
                )
                con.executemany(
                    "INSERT INTO channel_message (channel, expires, body) VALUES (?, ?, ?)",
                    [
                        (channel, now + self.expiry, body)
                        for channel in members
                        if queued.get(channel, 0) < self.get_capacity(channel)
                    ],
                )

        await self._run(operation)

    # --- flush extension ---------------------------------------------------------------------

    async def flush(self) -> None:
        """Delete every queued message and group membership in this layer's file."""

        def operation(con: sqlite3.Connection) -> None:
            with self._write(con):
                con.execute("DELETE FROM channel_message")
                con.execute("DELETE FROM channel_group")

        await self._run(operation)

    async def close(self) -> None:
        """Close the idle connections; the layer reopens connections if used again."""
        with self._pool_lock:
            pool, self._pool = self._pool, []
        for con in pool:
            con.close()
