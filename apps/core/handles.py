"""Readable handles (exp_0001, worker_0003) numbered per scope."""

from __future__ import annotations

import re

from django.db.models import QuerySet


def next_handle(queryset: QuerySet, prefix: str, *, field: str = "handle") -> str:
    """The next ``<prefix>_NNNN`` in ``queryset``.

    Callers hold a lock on the scope (the run row) so two writers never pick the same number;
    the unique constraint on the handle is the backstop.
    """
    pattern = re.compile(rf"^{re.escape(prefix)}_(\d+)$")
    highest = 0
    for handle in queryset.filter(**{f"{field}__startswith": f"{prefix}_"}).values_list(field, flat=True):
        match = pattern.match(handle)
        if match:
            highest = max(highest, int(match.group(1)))
    return f"{prefix}_{highest + 1:04d}"
