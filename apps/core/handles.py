"""Readable handles (exp_0001, worker_0003) numbered per scope."""

from __future__ import annotations

import re
from typing import Any

from django.db import connection
from django.db.models import QuerySet
from django.db.models.functions import Length

# pg_advisory_xact_lock keys serialising the numbering of handles no row scopes (global ones):
# "datapool" and "ckptglob" in ASCII.
GLOBAL_HANDLE_LOCKS = {"data": 0x64617461706F6F6C, "ckpt": 0x636B7074676C6F62}


def next_handle(queryset: QuerySet[Any], prefix: str, *, field: str = "handle") -> str:
    """The next ``<prefix>_NNNN`` in ``queryset``.

    Callers hold a lock on the scope (the run row) so two writers never pick the same number;
    the unique constraint on the handle is the backstop.
    """
    pattern = re.compile(rf"^{re.escape(prefix)}_(\d+)$")
    candidates = queryset.filter(**{f"{field}__startswith": f"{prefix}_"})
    # Handles made here are zero-padded to four digits, so among them numeric order is (length,
    # text) order: the database picks the highest without sending every handle of the scope here
    # (a run's thousands of experiments). Any other handle that could outrank it — more zeros,
    # more digits, not a number — is at least as long and comes first; then all are read.
    top = candidates.order_by(Length(field).desc(), f"-{field}").values_list(field, flat=True).first()
    if top is None:
        return f"{prefix}_0001"
    match = pattern.match(top)
    if match is not None and top == f"{prefix}_{int(match.group(1)):04d}":
        return f"{prefix}_{int(match.group(1)) + 1:04d}"
    highest = 0
    for handle in candidates.values_list(field, flat=True):
        match = pattern.match(handle)
        if match:
            highest = max(highest, int(match.group(1)))
    return f"{prefix}_{highest + 1:04d}"


def lock_global_handles(prefix: str) -> None:
    """Serialise the numbering of a global handle (``data_NNNN``, ``ckpt_NNNN``) until commit.

    A run's lock scopes its own handles (exp_, worker_); a global handle has no such row, and two
    runs numbering at once would pick the same one. PostgreSQL: a transaction-scoped advisory
    lock, released at commit or rollback. SQLite: the IMMEDIATE transaction mode already holds
    the database write lock from BEGIN.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [GLOBAL_HANDLE_LOCKS[prefix]])
