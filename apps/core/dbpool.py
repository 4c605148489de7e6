"""The web process's connection pool: a dead connection found on checkout clears out every dead one.

psycopg_pool checks a connection before lending it (an empty query) and, when the check fails,
throws it away and tries the next idle one, sleeping first with a back-off (1 s, 2 s, 4 s ...).
After every pooled connection was terminated at once (``pg_terminate_backend``, a failover, a
proxy that dropped its clients) the first request therefore waded through them one back-off at
a time and spent the whole pool timeout: a 503 after 5 s while PostgreSQL was up (issue 35).

Here a failed check also checks the rest of the idle connections at once (``ConnectionPool.check``,
public API: the dead ones go and the pool opens replacements in the background), so the request's
next try, after the pool's first back-off (about 1 s), finds a fresh connection instead of
another corpse.

Django builds the pool and always passes its own ``check=`` (``ConnectionPool.check_connection``
with ``CONN_HEALTH_CHECKS``), so a check cannot be given in the pool's OPTIONS; the web process
puts this one in place on the pool Django built (``pool_check_install``, rsiweb/asgi.py).
"""

from __future__ import annotations

import logging
from typing import Any

from psycopg_pool import ConnectionPool

logger = logging.getLogger(__name__)


def pool_check(conn: Any) -> None:
    """The pool's check on checkout (``check=`` of psycopg_pool): raises when ``conn`` is dead."""
    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        logger.warning("a pooled database connection was dead; checking the other idle ones")
        _check_idle()
        raise


def _check_idle() -> None:
    from django.db import DEFAULT_DB_ALIAS, connections  # noqa: PLC0415 - Django's, loaded by then

    pool = getattr(connections[DEFAULT_DB_ALIAS], "pool", None)  # SQLite has none
    if pool is not None:
        try:
            pool.check()
        except Exception:  # noqa: BLE001 - best effort: the request's own retry still decides
            logger.warning("could not check the idle pooled connections", exc_info=True)


def pool_check_install() -> bool:
    """Make ``pool_check`` the check of the default database's pool; False when there is no pool.

    psycopg_pool keeps the check it was built with in ``_check`` (psycopg-pool 3.3, pinned); the
    assertion stops the server at start if a new version moved it, rather than silently losing it.
    """
    from django.db import DEFAULT_DB_ALIAS, connections  # noqa: PLC0415 - Django's, loaded by then

    pool = getattr(connections[DEFAULT_DB_ALIAS], "pool", None)  # SQLite has none
    if pool is None:
        return False
    assert getattr(pool, "_check", None) is ConnectionPool.check_connection, "psycopg_pool's check moved"
    pool._check = pool_check
    return True
