"""No read path shows an event before it is sealed, however many agents write meanwhile.

Writers append events to the run's chain from their own threads (each its own database
connection, committing as agents' tool calls do) while the Main Agent pages the log through
``events_tail`` and the REST event list. A sealer stalled mid-batch is injected by holding the
chain's sealing lock (the advisory lock ``rsiweb_seal_chain`` tries), so committed, unsealed rows
are certain to exist during the reads; the writers' appends that follow the release seal them.
"""

from __future__ import annotations

import threading
import time

from django.db import connection, connections, transaction

from apps.experiments.events import chain_key, chain_verify, event_append
from apps.experiments.models import Event, EventChain

WRITERS = 3
READS = 20
PER_WRITER = 150  # events each writer appends at most, so the log stays a few pages long


def _append_until(stop: threading.Event, run, actor: str, written: list[int]) -> None:
    try:
        for _ in range(PER_WRITER):
            if stop.is_set():
                return
            written.append(event_append(type="test.noise", actor=actor, role="worker", run=run).pk)
    finally:
        connections.close_all()


def _hold_sealing_lock(chain_id: int, held: threading.Event, release: threading.Event) -> None:
    """A sealer that stalls inside its batch: the chain's sealing lock, held in an open transaction."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('rsiweb-chain'), %s)", [chain_id])
            held.set()
            release.wait(60)
    finally:
        connections.close_all()


def _assert_sealed_page(response, where: str) -> list[int]:
    assert response.status_code == 200, f"{where}: {response.status_code} {response.text[:500]}"
    body = response.json()
    events = body["events"] if "events" in body else body["results"]
    seqs = [event["seq"] for event in events]
    assert all(isinstance(seq, int) for seq in seqs), f"{where}: an unsealed event was shown: {seqs}"
    assert seqs == sorted(seqs), f"{where}: not in chain order: {seqs}"
    return seqs


def test_concurrent_writers_never_expose_unsealed_events(api, world, settings):
    settings.RSI_TOKEN_RATE = ""  # the reads' volume is not what the rate limit is for
    run = world.run
    chain = EventChain.objects.get(key=chain_key(run))
    stop, held, release = threading.Event(), threading.Event(), threading.Event()
    written: list[int] = []
    sealer = threading.Thread(target=_hold_sealing_lock, args=(chain.pk, held, release))
    sealer.start()
    assert held.wait(30)
    writers = [
        threading.Thread(target=_append_until, args=(stop, run, world.nodes["own"].handle, written))
        for _ in range(WRITERS)
    ]
    for writer in writers:
        writer.start()
    try:
        # Each writer's first append commits unsealed and then waits for the stalled sealer: the
        # reads start once such rows exist (on a loaded machine the threads take a while to start).
        deadline = time.monotonic() + 60
        while not Event.objects.filter(chain=chain, seq__isnull=True).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        last_seq = 0
        unsealed_seen = 0
        for index in range(READS):
            if index == READS // 2:
                release.set()  # the stalled sealer goes on; the writers' next appends seal the backlog
            unsealed_seen = max(unsealed_seen, Event.objects.filter(chain=chain, seq__isnull=True).count())
            _assert_sealed_page(api.call("main", "events_tail", {"limit": 200}), "events_tail (newest)")
            paged = _assert_sealed_page(api.call("main", "events_tail", {"after_seq": last_seq}), "events_tail page")
            assert all(seq > last_seq for seq in paged)
            last_seq = paged[-1] if paged else last_seq
            _assert_sealed_page(api.get("main", "/api/v1/events/", run=str(run.uuid), limit=200), "REST events")
            _assert_sealed_page(api.get("own", "/api/v1/events/", limit=200), "REST events (worker)")
    finally:
        release.set()
        stop.set()
        for thread in (*writers, sealer):
            thread.join(60)
    # The precondition of the test: committed, unsealed rows existed while it read.
    assert unsealed_seen > 0
    assert len(written) > WRITERS
    # One more append after the writers stopped seals whatever they left pending.
    event_append(type="test.noise", actor="system", role="system", run=run)
    assert not Event.objects.filter(chain=chain, seq__isnull=True).exists()
    assert chain_verify(chain.key).ok
    # Paging forward from the start reaches every event committed so far, each once (each page is
    # a tool call, recorded as one more event: the walk stops at the head it started from).
    head = EventChain.objects.get(pk=chain.pk).head_seq
    assert head == Event.objects.filter(chain=chain).count()
    seen: list[int] = []
    while not seen or seen[-1] < head:
        page = api.call("main", "events_tail", {"after_seq": seen[-1] if seen else 0, "limit": 200}).json()
        seen += [event["seq"] for event in page["events"]]
    assert seen[:head] == list(range(1, head + 1))
