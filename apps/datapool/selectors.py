"""Reads of the datapool shared by tools, views and workers."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import Any

from django.db.models import QuerySet

from apps.core.errors import ApplicationError, NotFound
from apps.datapool.models import DataEntry, DataReadmeEntry
from apps.datapool.services import data_load_rows
from apps.datapool.storage import artifact_store

MAX_ROWS = 1000


def data_entry_list(
    *,
    format: str | None = None,
    source_kind: str | None = None,
    search: str | None = None,
    formats: Sequence[str] | None = None,
) -> QuerySet[DataEntry]:
    """Datapool entries, oldest first. The pool is shared across runs (DESIGN.md).

    ``formats`` limits the list to those formats (agents get ``AGENT_FORMATS``: never chat).
    """
    entries = DataEntry.objects.all() if formats is None else DataEntry.objects.filter(format__in=formats)
    if format:
        entries = entries.filter(format=format)
    if source_kind:
        entries = entries.filter(source_kind=source_kind)
    if search:
        entries = entries.filter(name__icontains=search)
    return entries.order_by("created_at", "id")


def data_entry_get(handle_or_uuid: str, *, formats: Sequence[str] | None = None) -> DataEntry:
    """One entry by its handle (``data_0007``) or its uuid (404 when not one of ``formats``)."""
    entries = DataEntry.objects.all() if formats is None else DataEntry.objects.filter(format__in=formats)
    try:
        key = uuid.UUID(str(handle_or_uuid))
    except ValueError:
        entry = entries.filter(handle=handle_or_uuid).first()
    else:
        entry = entries.filter(uuid=key).first()
    if entry is None:
        raise NotFound("data_not_found", f"No datapool entry {handle_or_uuid!r}.")
    return entry


def data_rows(entry: DataEntry, limit: int = 20) -> list[dict[str, Any]]:
    """The first ``limit`` rows of an entry (at most MAX_ROWS), read from the artifact store."""
    return data_load_rows(entry=entry, limit=max(0, min(int(limit), MAX_ROWS)))


def data_readme(entry: DataEntry) -> QuerySet[DataReadmeEntry]:
    """An entry's provenance notes in the order they were written."""
    return entry.readme_entries.order_by("created_at", "id")


def data_stored_sha256(entry: DataEntry) -> str | None:
    """sha256 of the entry's bytes as stored now; None when the artifact cannot be read.

    The integrity checks compare it with the registered ``sha256``: bytes changed after
    registration are never trained on, and an unreadable artifact fails closed.
    """
    digest = hashlib.sha256()
    try:
        with artifact_store().open(entry.uri, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except (ApplicationError, OSError):
        return None
    return digest.hexdigest()
