"""One clock for every process: the database's.

Leases, heartbeats, staleness and the reapers compare times written by different processes on
different hosts; each host's wall clock may be off (issue 35: one gpu worker 90 s fast declared
five healthy attempts on another worker lost). So times that other processes compare are the
database's: in a statement, ``Now()`` (PostgreSQL's ``now()``/``CURRENT_TIMESTAMP``); where a
value is needed in Python (an event's time, which its hash covers; a lease's expiry computed
before the write), ``db_now()``.

``db_now()`` is the database's clock read through this process's: the offset between them is
measured with one ``SELECT clock_timestamp()`` (taken at the midpoint of the round trip) when
Django opens a connection and the last measurement is older than ``RESYNC_SECONDS``, so it costs
no round trip per call, follows a skew that drifts, and never adds a statement to a request
that already holds its connection (the query-count tests measure those). On SQLite (the
embedded single-machine mode) every process shares one clock, the local one.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.backends.signals import connection_created
from django.dispatch import receiver
from django.utils import timezone

RESYNC_SECONDS = 60.0

_lock = threading.RLock()  # re-entered: a measurement may open the connection (and so _resync)
_offset: timedelta | None = None  # database clock minus local clock
_measured_at = 0.0  # time.monotonic() of the last measurement


def _measure(conn: Any) -> timedelta:
    before = time.time()
    with conn.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (server,) = cursor.fetchone()
    after = time.time()
    local = datetime.fromtimestamp((before + after) / 2, tz=UTC)
    offset: timedelta = server - local
    return offset


def db_offset() -> timedelta:
    """The database's clock minus this process's (zero on SQLite)."""
    if connection.vendor != "postgresql":
        return timedelta(0)
    with _lock:
        if _offset is None:
            _remember(_measure(connection))
        assert _offset is not None
        return _offset


def _remember(offset: timedelta) -> None:
    global _offset, _measured_at  # noqa: PLW0603 - one measurement shared by the process's threads
    _offset, _measured_at = offset, time.monotonic()


@receiver(connection_created)
def _resync(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Measure again on a new connection, at most every ``RESYNC_SECONDS``."""
    if connection.vendor != "postgresql":
        return
    with _lock:
        if _offset is None or time.monotonic() - _measured_at > RESYNC_SECONDS:
            _remember(_measure(connection))


def db_now() -> datetime:
    """Now, on the database's clock."""
    return timezone.now() + db_offset()
