"""Spelling rules shared by every record that leaves the server as JSON (live events, snapshots).

A snapshot and a live event about the same record must compare equal in the browser, so both
spell times, long texts and optional ids through these.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last one an ellipsis when anything was dropped."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def iso(value: datetime | None) -> str | None:
    """A time as DjangoJSONEncoder spells it (milliseconds, ``Z``), so snapshots and events agree."""
    if value is None:
        return None
    text = value.isoformat()
    if value.microsecond:
        text = text[:23] + text[26:]
    if text.endswith("+00:00"):
        text = text[:-6] + "Z"
    return text


def text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
