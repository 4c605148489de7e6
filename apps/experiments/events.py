"""The tamper-evident event log: one hash chain per run (plus ``global``), append-only.

Each event stores ``content_sha256 = sha256(canonical_json(content))`` and, once sealed,
``hash = sha256(f"{prev_hash}:{seq}:{content_sha256}")``. Events are inserted with the state
change they record and sealed into the chain by one sealer at a time (:func:`chain_seal`), so
concurrent writers — processes, not just threads — never fork the chain; the unique
(chain, seq) constraint backs that up. A writer that gets the chain's lock inserts its event
already sealed; one that does not inserts it unsealed and seals after its commit, or, in the
web server, hands that seal to a thread of the process (``RSI_EVENT_SEAL_BACKGROUND``).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Required, TypedDict, Unpack

from django.conf import settings
from django.db import connection, transaction

from apps.core.clock import db_now
from apps.core.hashing import canonical_json
from apps.core.jsonsafe import storable
from apps.experiments.anchors import anchor_head, anchors_check
from apps.experiments.models import Event, EventChain

if TYPE_CHECKING:
    from apps.research.models import Run

logger = logging.getLogger(__name__)

GLOBAL_CHAIN = "global"
GENESIS_HASH = "0" * 64
REDACTED = "***"
_SECRET_WORDS = ("token", "secret", "password", "api_key", "apikey", "authorization", "cookie", "credential")


def redact(value: Any) -> Any:
    """Replace the values of secret-looking keys, at any depth, before they reach the log.

    Numbers are also written as PostgreSQL's JSONB gives them back (``_as_stored``), so the
    content hash taken at insert is the one ``chain_verify`` recomputes from the stored row.
    """
    if isinstance(value, dict):
        return {key: REDACTED if _secret_key(key) else redact(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, float):
        return _as_stored(value)
    return value


def _as_stored(value: float) -> float | int:
    """A float as JSONB returns it: JSONB keeps the decimal text's own digits, with no negative zero.

    Python writes 1e16 as ``1e+16``, which JSONB stores as the integer 10000000000000000 (and
    1e300 as 10**300 exactly, not the float's binary value); -0.0 comes back as 0.0. Every other
    finite float comes back as the same float.
    """
    if value == 0.0:
        return 0.0
    text = repr(value)
    return int(Decimal(text)) if "e+" in text else value


@functools.lru_cache(maxsize=4096)
def _secret_key(key: Any) -> bool:
    # Cached: the same few keys ("args", "status", "points", ...) come on every call.
    lowered = str(key).lower()
    return any(word in lowered for word in _SECRET_WORDS)


def chain_key(run: Run | None) -> str:
    return str(run.uuid) if run is not None else GLOBAL_CHAIN


def event_content(event: Event, *, run_uuid: str | None) -> dict[str, Any]:
    """The recorded content of an event: everything but its place in the chain."""
    return {
        "run": run_uuid,
        "created_at": event.created_at.isoformat(),
        "type": event.type,
        "actor": event.actor,
        "role": event.role,
        "tool": event.tool,
        "arguments": event.arguments,
        "result_ref": event.result_ref,
    }


def content_hash(content: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()


def _scalar_json(value: Any) -> str:
    # A string, None or number as canonical_json writes it inside an object.
    return json.dumps(value, ensure_ascii=False, default=str)


def content_json(event: PendingEvent, *, run_uuid: str | None) -> str:
    """``canonical_json(event_content(event, run_uuid=...))`` of an event about to be written.

    The keys in canonical_json's (sorted) order, with the arguments' canonical JSON spliced in:
    the arguments are serialised once per append, not twice.
    """
    return (
        f'{{"actor":{_scalar_json(event.actor)},"arguments":{event.arguments_json},'
        f'"created_at":{_scalar_json(event.created_at.isoformat())},"result_ref":{_scalar_json(event.result_ref)},'
        f'"role":{_scalar_json(event.role)},"run":{_scalar_json(run_uuid)},"tool":{_scalar_json(event.tool)},'
        f'"type":{_scalar_json(event.type)}}}'
    )


def link_hash(prev_hash: str, seq: int, content_sha256: str) -> str:
    """One link of the chain. PostgreSQL's rsiweb_seal_chain() computes exactly the same."""
    return hashlib.sha256(f"{prev_hash}:{seq}:{content_sha256}".encode()).hexdigest()


# rsiweb_event_append() and rsiweb_seal_chain() are installed by migrations 0005 and 0009. The
# call takes PendingEvent.params and answers (event_id, event_chain_id, event_sealed).
EVENT_APPEND_CALL = "rsiweb_event_append(%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s)"
_APPEND_SQL = f"SELECT * FROM {EVENT_APPEND_CALL}"


@dataclass
class PendingEvent:
    """An event ready for its chain, not yet written: ``event_append`` writes it, or a statement
    that also writes the change it records calls EVENT_APPEND_CALL with ``params`` and hands the
    answer to ``appended`` (one round trip for both; PostgreSQL only). The Event object is built
    only when asked for: a request that writes its event in its own statement never needs it."""

    run: Run | None
    key: str  # its chain's
    created_at: datetime
    type: str
    actor: str
    role: str
    tool: str
    arguments_json: str  # canonical JSON, as stored and hashed
    result_ref: str
    content_sha256: str
    _ids: tuple[int, int] | None = None  # (event, chain) once written
    _event: Event | None = None

    @property
    def written(self) -> bool:
        return self._ids is not None

    @property
    def params(self) -> list[Any]:
        run_id = None if self.run is None else self.run.pk
        return [self.key, run_id, self.created_at, self.type, self.actor, self.role, self.tool, self.arguments_json,
                self.result_ref, self.content_sha256]  # fmt: skip

    @property
    def event(self) -> Event:
        if self._event is None:
            self._event = Event(
                run=self.run, created_at=self.created_at, type=self.type, actor=self.actor, role=self.role,
                tool=self.tool, arguments=json.loads(self.arguments_json), result_ref=self.result_ref,
                content_sha256=self.content_sha256,
            )  # fmt: skip
            self._identify()
        return self._event

    def _identify(self) -> None:
        if self._event is not None and self._ids is not None:
            self._event.pk, self._event.chain_id = self._ids
            self._event._state.adding = False

    def appended(self, event_id: int, chain_id: int, sealed: bool) -> None:
        """Take rsiweb_event_append()'s answer: the row's id and chain, and whether it went in sealed."""
        self._ids = (event_id, chain_id)
        self._identify()
        if sealed:
            # Sealed under the chain's lock: an event skipped meanwhile is its own writer's to seal.
            _seal_recheck_drop(chain_id)
        else:
            _seal_after_commit(self.key, chain_id)


class EventFields(TypedDict, total=False):
    """What an event records, as ``event_prepare`` and ``event_append`` take it (keywords)."""

    type: Required[str]
    actor: Required[str]
    role: Required[str]
    run: Run | None
    tool: str
    arguments: dict[str, Any] | None
    result_ref: str


def event_prepare(**fields: Unpack[EventFields]) -> PendingEvent:
    """The event ``event_append`` would write with these values, its content hash taken, unwritten."""
    run = fields.get("run")
    key = chain_key(run)
    # Escaped, never refused: whatever a caller passes (a refused request's lone surrogate, NUL or
    # NaN), the event is written, since a crash here would lose the record. Numbers are written as
    # the database will return them, so the hash covers what chain_verify reads back.
    arguments_json = canonical_json(redact(storable(fields.get("arguments") or {})))
    pending = PendingEvent(
        run=run, key=key, created_at=db_now(), type=fields["type"], actor=fields["actor"], role=fields["role"],
        tool=fields.get("tool", ""), arguments_json=arguments_json, result_ref=fields.get("result_ref", ""),
        content_sha256="",
    )  # fmt: skip
    content = content_json(pending, run_uuid=None if run is None else key)
    pending.content_sha256 = hashlib.sha256(content.encode("utf-8")).hexdigest()
    return pending


# Who hears about an appended event: apps above the log register from their AppConfig.ready
# (apps.alerts: notifications), so the log imports none of them. A hook runs inside the caller's
# transaction and must be cheap for the events it ignores (a type check).
_ON_APPEND: list[Callable[[Event], object]] = []


def event_hook_register(hook: Callable[[Event], object]) -> None:
    """Call ``hook(event)`` after every ``event_append``; registering twice is a no-op."""
    if hook not in _ON_APPEND:
        _ON_APPEND.append(hook)


def event_append(**fields: Unpack[EventFields]) -> Event:
    """Append one event to the run's chain, committed with the caller's transaction.

    When no other transaction is sealing the chain, the row is inserted sealed and the chain's
    lock stays with the caller's transaction until it ends. Otherwise it is inserted unsealed and
    sealed right after the caller's commit, waiting for that other transaction to end (read
    ``seq``/``hash`` back from the database when needed). Nobody waits for the lock inside a
    transaction, so appends of different transactions do not serialise on one fsync each.
    """
    event = pending_event_write(event_prepare(**fields))
    for hook in _ON_APPEND:
        hook(event)
    return event


def pending_event_write(pending: PendingEvent) -> Event:
    """Write a prepared event on its own (``event_append``)."""
    if connection.vendor == "postgresql":
        # One round trip (and, outside a transaction, one commit): chain look-up, a seal of what is
        # pending that does not wait when another writer is sealing this chain, and the insert.
        with connection.cursor() as cursor:
            cursor.execute(_APPEND_SQL, pending.params)
            pending.appended(*cursor.fetchone())
        return pending.event
    event = pending.event
    chain, _ = EventChain.objects.get_or_create(key=pending.key)
    event.chain = chain
    with transaction.atomic():
        event.save(force_insert=True)
        # IMMEDIATE transactions serialise SQLite's writers: the seal always gets through.
        _seal_batch(chain)
    _seal_recheck_drop(chain.pk)
    pending._ids = (event.pk, chain.pk)
    return event


class _ChainRecheck:
    """The after-commit re-check of one chain: ``chain_seal`` (waiting for the lock) as an on_commit callback.

    Where ``RSI_EVENT_SEAL_BACKGROUND`` is on (the web server, rsiweb/asgi.py) the re-check is
    handed to the process's background sealer, so the call that wrote the event answers at once.
    """

    def __init__(self, key: str, chain_id: int) -> None:
        self.key = key
        self.chain_id = chain_id
        self.needed = True

    def __call__(self) -> None:
        if not self.needed:
            return
        if getattr(settings, "RSI_EVENT_SEAL_BACKGROUND", False):
            BACKGROUND_SEALER.request(self.key, self.chain_id)
        else:
            chain_seal(self.key, chain_id=self.chain_id, wait=True)


class _BackgroundSealer:
    """The re-checks of one process, off its request threads: one thread seals the chains asked for.

    Under load most appends of a busy run find its chain being sealed by another transaction
    (bench/append_contention.py, 8 clients: more than half), and each re-check cost its call a round
    trip spent waiting for that transaction, then a commit of its own. Here the asks for one chain
    collapse into one waiting seal, which seals every event of the chain committed by then; an ask
    that comes while that seal runs gets one more. Nothing is lost if the process dies first: the
    next append to the chain seals what is pending (rsiweb_seal_chain), and so does chain_verify.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wanted: dict[int, str] = {}  # chain id -> key, asked for and not yet sealed
        self._wake = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._busy = False
        self._pid = 0

    def request(self, key: str, chain_id: int) -> None:
        with self._lock:
            self._wanted[chain_id] = key
            if self._pid != os.getpid():  # first use in this process (or in a forked child)
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="rsiweb-event-sealer", daemon=True).start()
                atexit.register(self.drain)  # a server stopped cleanly seals what it was asked to
            self._wake.notify()

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every chain asked for so far is sealed (or ``timeout``); True when it is."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._wanted or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._pid != os.getpid():
                    return False
                self._idle.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._wanted:
                    self._busy = False
                    self._idle.notify_all()
                    self._wake.wait()
                chain_id, key = self._wanted.popitem()
                self._busy = True
            try:
                chain_seal(key, chain_id=chain_id, wait=True)
            except Exception:
                # The database away, say: the chain's next append or chain_verify seals what is pending.
                logger.exception("event chain %s: background seal failed", key)
            with self._lock:
                idle = not self._wanted
            if idle:
                connection.close()  # hold none while idle (a pooled one goes back to the pool)


BACKGROUND_SEALER = _BackgroundSealer()


def _seal_after_commit(key: str, chain_id: int) -> None:
    """Re-check the chain once the current transaction commits: once per chain, not per event.

    An append that found the chain being sealed by another transaction left its event unsealed;
    that sealer may not see it (it was not committed), so this writer seals it after its own
    commit, waiting for the sealer to finish. One re-check seals every event of the chain that
    the transaction committed, so an append finds its chain's re-check already pending and adds
    none. That pending callback is as sure to run as a new one would be: Django drops the
    callbacks of a savepoint that rolls back, so a callback still pending either commits with
    the outermost transaction or belongs to a savepoint that is still open around this append
    (whose rollback takes this event too).
    """
    if connection.in_atomic_block:
        for _, callback in _pending_rechecks(chain_id):
            callback.needed = True
            return
    transaction.on_commit(_ChainRecheck(key, chain_id))


def _seal_recheck_drop(chain_id: int) -> None:
    """An append sealed under the chain's lock: a pending re-check of the same savepoint is moot.

    The lock sealed this transaction's earlier events of the chain too, and stays held to its
    end, so its later appends are sealed as they are inserted. Only a re-check registered in the
    same savepoint is dropped: if this savepoint rolls back, the lock and its seals go with it,
    and an outer re-check must still run.
    """
    if not connection.in_atomic_block:
        return
    savepoints = set(connection.savepoint_ids)
    for sids, callback in _pending_rechecks(chain_id):
        if sids == savepoints:
            callback.needed = False


def _pending_rechecks(chain_id: int) -> list[tuple[set[str], _ChainRecheck]]:
    """The chain's re-checks among the callbacks waiting for this transaction's commit."""
    # Django's entries are (savepoint ids, callback, robust); its stubs know only two of them.
    entries: list[tuple[Any, ...]] = list(connection.run_on_commit)
    return [
        (entry[0], entry[1])
        for entry in entries
        if isinstance(entry[1], _ChainRecheck) and entry[1].chain_id == chain_id
    ]


def _seal_batch(chain: EventChain) -> int:
    """Seal the chain's pending events (SQLite); returns how many.

    PostgreSQL runs the same algorithm server-side (``rsiweb_seal_chain``, under a
    transaction-scoped advisory try-lock); on SQLite, IMMEDIATE transactions already serialise
    writers, so no one else can be sealing meanwhile.
    """
    with transaction.atomic():
        pending = list(Event.objects.filter(chain_id=chain.pk, hash="").order_by("id"))
        if not pending:
            return 0
        seq, prev_hash = EventChain.objects.filter(pk=chain.pk).values_list("head_seq", "head_hash").get()
        for event in pending:
            seq += 1
            event.seq, event.prev_hash = seq, prev_hash
            event.hash = prev_hash = link_hash(prev_hash, seq, event.content_sha256)
        Event.objects.bulk_update(pending, ["seq", "prev_hash", "hash"], batch_size=500)
        EventChain.objects.filter(pk=chain.pk).update(head_seq=seq, head_hash=prev_hash)
    return len(pending)


def chain_seal(key: str, *, chain_id: int | None = None, wait: bool = False) -> int:
    """Seal every committed, unsealed event of one chain, in insertion order; returns how many.

    Safe from any process at any time. One sealer at a time extends a chain (a lock held to the
    end of the sealing transaction), and a batch shares one transaction. Without ``wait`` a call
    that finds the chain being sealed leaves at once (returns 0); with it, it waits for that
    sealer's transaction to end and then seals, which is what a writer whose event was inserted
    unsealed does after its commit, so nothing stays unsealed.
    """
    if chain_id is None:
        chain_id = EventChain.objects.filter(key=key).values_list("pk", flat=True).first()
        if chain_id is None:
            return 0
    sealed = 0
    if connection.vendor == "postgresql":
        # Each call is one round trip: it seals what is pending (0 when nothing is, -1 when another
        # sealer holds the chain and ``wait`` is off).
        function = "rsiweb_seal_chain_wait" if wait else "rsiweb_seal_chain"
        while True:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT {function}(%s)", [chain_id])
                count = int(cursor.fetchone()[0])
            if count <= 0:
                return sealed
            sealed += count
    chain = EventChain(pk=chain_id, key=key)
    while Event.objects.filter(chain_id=chain_id, hash="").exists():
        sealed += _seal_batch(chain)
    return sealed


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
    chain_seal(key)  # events committed but not yet sealed are sealed first, never skipped
    chain = EventChain.objects.get(key=key)
    run_uuid = None if key == GLOBAL_CHAIN else key
    prev_hash = GENESIS_HASH
    expected_seq = 1
    count = 0
    hashes: dict[int, str] = {}
    for event in Event.objects.filter(chain=chain).exclude(hash="").order_by("seq").iterator(chunk_size=2000):
        count += 1
        if event.seq != expected_seq:
            return ChainReport(key, count, expected_seq, f"event {expected_seq} is missing (next is {event.seq})")
        if event.prev_hash != prev_hash:
            return ChainReport(key, count, event.seq, "prev_hash does not match the previous event's hash")
        if content_hash(event_content(event, run_uuid=run_uuid)) != event.content_sha256:
            return ChainReport(key, count, event.seq, "content does not match its hash (the event was altered)")
        if link_hash(prev_hash, event.seq, event.content_sha256) != event.hash:
            return ChainReport(key, count, event.seq, "link hash does not match (the chain was rewritten)")
        prev_hash = event.hash
        if run_uuid is not None:
            hashes[expected_seq] = event.hash
        expected_seq += 1
    if chain.head_seq != expected_seq - 1 or chain.head_hash != prev_hash:
        return ChainReport(key, count, expected_seq, "chain head does not match the last event (events removed)")
    # The head as anchored outside the database (apps.experiments.anchors): a cut tail or a
    # re-hashed chain verifies link by link, but no longer holds an anchored event.
    broken = anchors_check(key, hashes, chain.head_seq)
    if broken is not None:
        return ChainReport(key, count, broken[0], broken[1])
    # Anchored once committed: a verification inside a transaction that rolls back (an import
    # refused late) leaves no anchor for a chain that does not exist.
    head_seq, head_hash = chain.head_seq, chain.head_hash
    transaction.on_commit(lambda: anchor_head(key, head_seq, head_hash))
    return ChainReport(key, count, None)
