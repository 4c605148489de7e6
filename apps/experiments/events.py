"""The tamper-evident event log: one hash chain per run (plus ``global``), append-only.

Each event stores ``prev_hash`` and ``hash = sha256(prev_hash + canonical_json(body))``. The
chain head row is locked while appending, so concurrent writers — processes, not just threads —
queue on it instead of forking the chain; the unique (chain, seq) constraint backs that up.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from apps.core.hashing import canonical_json
from apps.experiments.models import Event, EventChain

if TYPE_CHECKING:
    from apps.research.models import Run

GLOBAL_CHAIN = "global"
GENESIS_HASH = "0" * 64
REDACTED = "***"
_SECRET_WORDS = ("token", "secret", "password", "api_key", "apikey", "authorization", "cookie", "credential")


def redact(value: Any) -> Any:
    """Replace the values of secret-looking keys, at any depth, before they reach the log."""
    if isinstance(value, dict):
        return {
            key: REDACTED if any(word in str(key).lower() for word in _SECRET_WORDS) else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value


def chain_key(run: Run | None) -> str:
    return str(run.uuid) if run is not None else GLOBAL_CHAIN


def event_body(event: Event, *, run_uuid: str | None) -> dict[str, Any]:
    """The hashed content of an event: everything but its own hash and the chain pointer."""
    return {
        "seq": event.seq,
        "run": run_uuid,
        "created_at": event.created_at.isoformat(),
        "type": event.type,
        "actor": event.actor,
        "role": event.role,
        "tool": event.tool,
        "arguments": event.arguments,
        "result_ref": event.result_ref,
    }


def link_hash(prev_hash: str, body: dict[str, Any]) -> str:
    return hashlib.sha256((prev_hash + canonical_json(body)).encode("utf-8")).hexdigest()


def event_append(
    *,
    type: str,
    actor: str,
    role: str,
    run: Run | None = None,
    tool: str = "",
    arguments: dict[str, Any] | None = None,
    result_ref: str = "",
) -> Event:
    """Append one event to the run's chain. Locks the chain head until the caller's commit."""
    key = chain_key(run)
    with transaction.atomic():
        EventChain.objects.get_or_create(key=key)
        # The row lock serialises appenders on PostgreSQL; on SQLite the IMMEDIATE transaction
        # mode already holds the database write lock from BEGIN.
        chain = EventChain.objects.select_for_update().get(key=key)
        event = Event(
            chain=chain,
            seq=chain.head_seq + 1,
            run=run,
            created_at=timezone.now(),
            type=type,
            actor=actor,
            role=role,
            tool=tool,
            arguments=redact(arguments or {}),
            result_ref=result_ref,
            prev_hash=chain.head_hash,
        )
        event.hash = link_hash(event.prev_hash, event_body(event, run_uuid=None if run is None else key))
        event.save(force_insert=True)
        chain.head_seq = event.seq
        chain.head_hash = event.hash
        chain.save(update_fields=["head_seq", "head_hash", "updated_at"])
    return event


@dataclass(frozen=True)
class ChainReport:
    key: str
    events: int
    broken_at: int | None  # seq of the first broken link, None when the chain verifies
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.broken_at is None


def chain_verify(key: str) -> ChainReport:
    """Recompute every link of one chain and name the first that does not hold."""
    chain = EventChain.objects.get(key=key)
    run_uuid = None if key == GLOBAL_CHAIN else key
    prev_hash = GENESIS_HASH
    expected_seq = 1
    count = 0
    for event in Event.objects.filter(chain=chain).order_by("seq").iterator(chunk_size=2000):
        count += 1
        if event.seq != expected_seq:
            return ChainReport(key, count, expected_seq, f"event {expected_seq} is missing (next is {event.seq})")
        if event.prev_hash != prev_hash:
            return ChainReport(key, count, event.seq, "prev_hash does not match the previous event's hash")
        if link_hash(prev_hash, event_body(event, run_uuid=run_uuid)) != event.hash:
            return ChainReport(key, count, event.seq, "content does not match its hash (the event was altered)")
        prev_hash = event.hash
        expected_seq += 1
    if chain.head_seq != expected_seq - 1 or chain.head_hash != prev_hash:
        return ChainReport(key, count, expected_seq, "chain head does not match the last event (events removed)")
    return ChainReport(key, count, None)
