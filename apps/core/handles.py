"""Readable handles (exp_0001, worker_0003) numbered per scope."""

from __future__ import annotations

import re
from typing import Any

from django.db.models import QuerySet
from django.db.models.functions import Length


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
