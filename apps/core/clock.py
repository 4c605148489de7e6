"""One clock for every process: the database's.

Leases, heartbeats, staleness and the reapers compare times written by different processes on
different hosts; each host's wall clock may be off (issue 35: one gpu worker 90 s fast declared
five healthy attempts on another worker lost). So times that other processes compare are the
database's: in a statement, ``Now()`` (PostgreSQL's ``now()``/``CURRENT_TIMESTAMP``); where a
value is needed in Python (an event's time, which its hash covers; a lease's expiry computed
before the write), ``db_now()``.

``db_now()`` is the database's clock read through this process's: the offset between them is
measured with one ``SELECT clock_timestamp()`` (taken at the midpoint of the round trip) and
measured again every ``RESYNC_SECONDS``, so it costs no round trip per call and follows a skew
that drifts. On SQLite (the embedded single-machine mode) every process shares one clock, the
local one.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils import timezone

RESYNC_SECONDS = 60.0

_lock = threading.Lock()
_offset: timedelta | None = None  # database clock minus local clock
_measured_at = 0.0  # time.monotonic() of the last measurement


def _measure() -> timedelta:
    before = time.time()
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (server,) = cursor.fetchone()
    after = time.time()
    local = datetime.fromtimestamp((before + after) / 2, tz=UTC)
    offset: timedelta = server - local
    return offset


def db_offset() -> timedelta:
    """The database's clock minus this process's (zero on SQLite); measured at most every minute."""
    global _offset, _measured_at  # noqa: PLW0603 - one measurement shared by the process's threads
    if connection.vendor != "postgresql":
        return timedelta(0)
    with _lock:
        if _offset is None or time.monotonic() - _measured_at > RESYNC_SECONDS:
            _offset = _measure()
            _measured_at = time.monotonic()
        return _offset


def db_now() -> datetime:
    """Now, on the database's clock."""
    return timezone.now() + db_offset()
