"""The event log is append-only at the database and a hash chain that exposes tampering."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.core.hashing import canonical_json
from apps.experiments.events import (
    BACKGROUND_SEALER,
    GLOBAL_CHAIN,
    _ChainRecheck,
    _seal_after_commit,
    chain_key,
    chain_seal,
    chain_verify,
    content_json,
    event_append,
    event_content,
    event_prepare,
    pending_event_write,
)
from apps.experiments.models import Event, EventChain
from tests.factories import make_run
from tests.support.procs import ROOT, child_env, run_python, sqlite_env

pytestmark = pytest.mark.django_db


def append_some(run, n=5):
    events = [
        event_append(run=run, type="test.happened", actor="worker_0001", role="worker", arguments={"i": i})
        for i in range(n)
    ]
    # Inside the test's transaction nothing commits, so seal explicitly (production seals on commit).
    chain_seal(chain_key(run))
    for event in events:
        event.refresh_from_db()
    return events


def test_events_chain_and_redact_secrets(run):
    events = append_some(run, 3)
    assert [e.seq for e in events] == [2, 3, 4]  # seq 1 is run.created
    assert events[1].prev_hash == events[0].hash
    leaked = event_append(
        run=run,
        type="tool.called",
        actor="w",
        role="worker",
        arguments={"api_key": "sk-123", "nested": {"Authorization": "Bearer x"}, "lr": 0.001},
    )
    leaked.refresh_from_db()
    assert leaked.arguments == {"api_key": "***", "nested": {"Authorization": "***"}, "lr": 0.001}
    assert chain_verify(chain_key(run)).ok


NUMBERS = {"i": 1, "neg_zero": -0.0, "e16": 1e16, "e300": 1e300, "max": 1.7976931348623157e308, "tiny": 5e-324,
           "small": 1.5e-7, "whole": 5.0, "list": [-0.0, 2.5e16, -1e22]}  # fmt: skip
AWKWARD = [
    {},
    NUMBERS,
    {'quote"': "é\u2028\\", "z": [None, True, {"b": 1, "a": 2}]},
    {"nul": "a\x00b", "lone": "\ud800", "nan": float("nan"), "deep": [[[[[1]]]]]},
]


@pytest.mark.parametrize("arguments", AWKWARD)
def test_an_event_s_content_hash_is_the_hash_of_its_canonical_content_as_stored(run, arguments):
    # event_append serialises the arguments once and splices them into the content (content_json);
    # chain_verify hashes canonical_json(event_content(...)) of the row as read back: they agree,
    # numbers included (JSONB gives 1e16 back as an integer and -0.0 as 0.0).
    pending = event_prepare(run=run, type="t.\u00e9\"", actor='a"b', role="worker", tool="t\\",
                            arguments=arguments, result_ref="r\u2028")  # fmt: skip
    event = pending_event_write(pending)
    event.refresh_from_db()
    content = canonical_json(event_content(event, run_uuid=str(run.uuid)))
    assert content_json(pending, run_uuid=str(run.uuid)) == content
    assert event.content_sha256 == hashlib.sha256(content.encode()).hexdigest()
    global_event = event_append(type="t", actor="a", role="system", arguments=arguments)
    global_event.refresh_from_db()
    stored = canonical_json(event_content(global_event, run_uuid=None))
    assert global_event.content_sha256 == hashlib.sha256(stored.encode()).hexdigest()
    chain_seal(chain_key(run))
    assert chain_verify(chain_key(run)).ok


def test_update_and_delete_fail_at_the_database(run):
    event = append_some(run, 1)[0]
    assert event.hash
    with pytest.raises(DatabaseError), transaction.atomic():
        Event.objects.filter(pk=event.pk).update(actor="someone else")
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM experiments_event WHERE id = %s", [event.pk])
    event.refresh_from_db()
    assert event.actor == "worker_0001"


def test_unsealed_event_content_cannot_change_and_seal_happens_once(run):
    chain = EventChain.objects.get(key=chain_key(run))
    event = Event.objects.create(
        chain=chain,
        run=run,
        created_at=run.created_at,
        type="t",
        actor="a",
        role="worker",
        arguments={"x": 1},
        content_sha256="c" * 64,
    )
    assert event.hash == ""  # inserted, not yet sealed
    with pytest.raises(DatabaseError), transaction.atomic():
        Event.objects.filter(pk=event.pk).update(actor="b")  # content change on an unsealed row
    chain_seal(chain_key(run))
    event.refresh_from_db()
    assert event.hash
    assert event.seq == 2
    with pytest.raises(DatabaseError), transaction.atomic():
        Event.objects.filter(pk=event.pk).update(hash="f" * 64, prev_hash="e" * 64)  # a second seal
    # Sealing does not vouch for content: the planted content hash does not match the content.
    report = chain_verify(chain_key(run))
    assert (report.broken_at, "content") == (2, report.reason.split()[0])


def test_tampering_with_trigger_dropped_is_found(run):
    events = append_some(run, 5)
    target = events[2]
    with connection.cursor() as cursor:
        # Flush deferred FK checks first: PostgreSQL refuses ALTER TABLE while they are pending.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        # An attacker with DDL rights: switch the guard off, rewrite history, switch it back on.
        cursor.execute("ALTER TABLE experiments_event DISABLE TRIGGER experiments_event_seal_once")
        cursor.execute("UPDATE experiments_event SET arguments = '{\"i\": 99}' WHERE id = %s", [target.pk])
        cursor.execute("ALTER TABLE experiments_event ENABLE TRIGGER experiments_event_seal_once")
    report = chain_verify(chain_key(run))
    assert report.broken_at == target.seq
    with pytest.raises(CommandError, match=f"at seq {target.seq}"):
        call_command("verify_events", run=str(run.uuid))


def test_deleting_the_last_event_is_found(run):
    events = append_some(run, 3)
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ALTER TABLE experiments_event DISABLE TRIGGER experiments_event_no_delete")
        cursor.execute("DELETE FROM experiments_event WHERE id = %s", [events[-1].pk])
        cursor.execute("ALTER TABLE experiments_event ENABLE TRIGGER experiments_event_no_delete")
    report = chain_verify(chain_key(run))
    assert not report.ok
    assert report.broken_at == events[-1].seq


WRITER = """
import sys
from apps.research.models import Run
from apps.experiments.events import event_append
run = Run.objects.get(uuid=sys.argv[1])
for i in range(int(sys.argv[2])):
    event_append(run=run, type="test.concurrent", actor="writer-" + sys.argv[3], role="worker", arguments={"i": i})
"""


@pytest.mark.django_db(transaction=True)
def test_concurrent_writer_processes_keep_one_chain():
    run = make_run(name="concurrent")
    per_writer = 25
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "import django; django.setup()\n" + WRITER, str(run.uuid), str(per_writer), str(i)],
            env=child_env(),
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
    events = Event.objects.filter(run=run).order_by("seq")
    assert events.count() == 1 + 8 * per_writer
    assert list(events.values_list("seq", flat=True)) == list(range(1, 2 + 8 * per_writer))
    assert len({e.actor for e in events if e.type == "test.concurrent"}) == 8
    assert chain_verify(chain_key(run)).ok


SQLITE_SCENARIO = """
from django.core.management import call_command
call_command("migrate", verbosity=0)
from tests.factories import make_run
from apps.experiments.events import event_append
run = make_run(name="sqlite")
for i in range(4):
    event_append(run=run, type="test.sqlite", actor="w", role="worker", arguments={"i": i})
print(run.uuid)
"""


def test_sqlite_backend_enforces_append_only_and_verify_finds_tampering(tmp_path: Path):
    env = sqlite_env(tmp_path)
    made = run_python(SQLITE_SCENARIO, env=env, timeout=180)
    run_uuid = made.stdout.strip().splitlines()[-1]
    db = sqlite3.connect(tmp_path / "rsiweb.sqlite3")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("UPDATE experiments_event SET actor = 'x' WHERE seq = 2")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("DELETE FROM experiments_event")
    # With the trigger dropped the write goes through, and the chain check names the link.
    db.execute("DROP TRIGGER experiments_event_seal_once")
    db.execute(
        "UPDATE experiments_event SET actor = 'forger' WHERE seq = 3 AND chain_id = "
        "(SELECT id FROM experiments_eventchain WHERE key = ?)",
        (run_uuid,),
    )
    db.commit()
    verified = subprocess.run(
        [sys.executable, "manage.py", "verify_events", "--run", run_uuid],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verified.returncode != 0
    assert "BROKEN at seq 3" in verified.stdout


def test_both_backends_install_the_same_guards(tmp_path: Path):
    """SQLite drops triggers when it rebuilds a table for ALTER; every guard must survive migrate."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(RSI_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="rsiweb.settings.base", PYTHONPATH=str(ROOT))
    migrated = subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert migrated.returncode == 0, migrated.stderr
    sqlite_names = {
        row[0]
        for row in sqlite3.connect(tmp_path / "rsiweb.sqlite3").execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger'"
        )
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")
        pg_names = {row[0] for row in cursor.fetchall()}
    assert {
        "experiments_event_seal_once",
        "experiments_event_no_delete",
        "datapool_datareadmeentry_no_update",
        "experiments_experiment_owner_id_immutable",
        "experiments_eventchain_no_delete",
        "experiments_metricpoint_no_update",
    } <= pg_names
    # SQLite has no deferred triggers; the commit-time checks (*_at_commit) are PostgreSQL's alone.
    assert sqlite_names == {name for name in pg_names if not name.endswith("_at_commit")}


def _hold_chain(chain_id: int, release: threading.Event, *, seconds: float) -> threading.Thread:
    """A thread whose transaction holds the chain's sealing lock until ``release`` or ``seconds``."""
    held = threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(hashtext('rsiweb-chain'), %s)", [chain_id])
                held.set()
                release.wait(seconds)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    return holder


def _rechecks(chain_id: int) -> int:
    return sum(
        isinstance(f, _ChainRecheck) and f.chain_id == chain_id and f.needed for _, f, _ in connection.run_on_commit
    )


def test_an_append_sealed_under_the_lock_needs_no_recheck_and_none_is_lost_with_a_savepoint(run):
    events = append_some(run, 3)
    other = make_run(name="other run")
    event_append(run=other, type="test.happened", actor="worker_0001", role="worker")
    # Nobody else was sealing: every event was sealed as it was inserted, with no re-check pending.
    assert all(event.hash for event in events)
    assert _rechecks(events[0].chain_id) == 0
    assert _rechecks(other.events.get(type="test.happened").chain_id) == 0
    fresh = EventChain.objects.create(key="test-fresh-chain")

    def recheck_twice_then_fail() -> None:
        with transaction.atomic():
            _seal_after_commit(fresh.key, fresh.pk)
            _seal_after_commit(fresh.key, fresh.pk)
            assert _rechecks(fresh.pk) == 1
            raise RuntimeError("the savepoint rolls back, and its re-check with it")

    with pytest.raises(RuntimeError):
        recheck_twice_then_fail()
    assert _rechecks(fresh.pk) == 0
    _seal_after_commit(fresh.key, fresh.pk)
    assert _rechecks(fresh.pk) == 1
    # A re-check stays when a sealed append inside a savepoint (which may still roll back) follows
    # it, and goes when one at its own level does.
    chain = events[0].chain_id
    _seal_after_commit(chain_key(run), chain)
    with transaction.atomic():
        event_append(run=run, type="test.inner", actor="worker_0001", role="worker")
        assert _rechecks(chain) == 1
    assert _rechecks(chain) == 1
    event_append(run=run, type="test.outer", actor="worker_0001", role="worker")
    assert _rechecks(chain) == 0


@pytest.mark.django_db(transaction=True)
def test_a_transaction_of_many_events_seals_them_as_inserted_and_verifies():
    run = make_run()
    with CaptureQueriesContext(connection) as queries, transaction.atomic():  # commits inside the capture
        for i in range(4):
            event_append(run=run, type="test.happened", actor="worker_0001", role="worker", arguments={"i": i})
            event_append(type="test.global", actor="system", role="system", arguments={"i": i})
    assert not [q["sql"] for q in queries if "rsiweb_seal_chain" in q["sql"]]
    assert not Event.objects.filter(hash="").exists()
    assert chain_verify(chain_key(run)).ok
    assert chain_verify(GLOBAL_CHAIN).ok


@pytest.mark.django_db(transaction=True)
def test_an_append_that_finds_the_chain_taken_is_sealed_after_its_commit():
    run = make_run()
    event_append(run=run, type="test.first", actor="worker_0001", role="worker")
    chain = EventChain.objects.get(key=chain_key(run))
    # Another transaction holds the chain's lock for a while, as a concurrent writer would.
    holder = _hold_chain(chain.pk, threading.Event(), seconds=1.5)
    with transaction.atomic():
        event = event_append(run=run, type="test.blocked", actor="worker_0001", role="worker")
        assert Event.objects.get(pk=event.pk).hash == ""  # inserted unsealed: the chain was taken
        assert _rechecks(chain.pk) == 1
    # The commit's re-check waited for the holder, then sealed it.
    holder.join(30)
    assert Event.objects.get(pk=event.pk).hash
    assert chain_verify(chain_key(run)).ok


@pytest.mark.django_db(transaction=True)
def test_with_the_background_sealer_a_blocked_append_answers_at_once_and_is_sealed_after(settings):
    """The web server's mode (RSI_EVENT_SEAL_BACKGROUND): the writer does not wait for the chain's
    holder; a thread of the process seals its event once the holder is done, in chain order."""
    settings.RSI_EVENT_SEAL_BACKGROUND = True
    run = make_run()
    event_append(run=run, type="test.first", actor="worker_0001", role="worker")
    chain = EventChain.objects.get(key=chain_key(run))
    release = threading.Event()
    holder = _hold_chain(chain.pk, release, seconds=30)
    try:
        blocked = []
        for i in range(3):  # three writers' transactions, each committed while the chain is held
            with transaction.atomic():
                blocked.append(event_append(run=run, type="test.blocked", actor="worker_0001", role="worker",
                                            arguments={"i": i}))  # fmt: skip
        # Every commit returned while the holder still held the chain: nobody waited for it.
        assert holder.is_alive()
        assert all(Event.objects.get(pk=event.pk).hash == "" for event in blocked)
        assert not BACKGROUND_SEALER.drain(timeout=0.5)  # its seal is waiting for the holder
    finally:
        release.set()
        holder.join(30)
    assert BACKGROUND_SEALER.drain(timeout=30)
    sealed = [Event.objects.get(pk=event.pk) for event in blocked]
    assert [event.seq for event in sealed] == sorted(event.seq for event in sealed)
    assert all(event.hash for event in sealed)
    assert chain_verify(chain_key(run)).ok


@pytest.mark.django_db(transaction=True)
def test_an_event_a_dead_background_sealer_left_unsealed_is_sealed_by_the_chain_s_next_append():
    """A process that dies before its background seal loses nothing: the chain's next append seals it."""
    run = make_run()
    event_append(run=run, type="test.first", actor="worker_0001", role="worker")
    chain = EventChain.objects.get(key=chain_key(run))
    # A web process (background sealing on): one thread holds the chain, another commits an event
    # unsealed and asks the sealer, and the process is killed before the holder lets go.
    left = Event.objects.get(pk=_append_in_a_web_process(run, chain, hold_seconds=None, killed=True))
    assert left.hash == ""  # committed, and its seal died with the process
    after = event_append(run=run, type="test.next", actor="worker_0001", role="worker")
    left.refresh_from_db()
    after.refresh_from_db()
    assert left.hash
    assert after.hash
    assert left.seq < after.seq
    assert chain_verify(chain_key(run)).ok


@pytest.mark.django_db(transaction=True)
def test_a_process_that_exits_cleanly_first_seals_what_its_background_sealer_was_asked_to():
    run = make_run()
    event_append(run=run, type="test.first", actor="worker_0001", role="worker")
    chain = EventChain.objects.get(key=chain_key(run))
    # The chain is held for a second after the event commits; the process then exits normally.
    last = Event.objects.get(pk=_append_in_a_web_process(run, chain, hold_seconds=1, killed=False))
    assert last.hash
    assert chain_verify(chain_key(run)).ok


def _append_in_a_web_process(run, chain, *, hold_seconds: float | None, killed: bool) -> int:
    """In a child process with background sealing on (as the web server runs): a thread holds the
    chain (``hold_seconds``, or until the process ends), the main thread commits one event while
    it is held, then the process is killed (``os._exit``) or exits normally. The event's id."""
    child = run_python(
        "import os, threading\n"
        "from django.db import connection, transaction\n"
        "from apps.experiments.events import event_append\n"
        "from apps.research.models import Run\n"
        "held = threading.Event()\n"
        "def hold():\n"
        "    with transaction.atomic(), connection.cursor() as cursor:\n"
        f"        cursor.execute(\"SELECT pg_advisory_xact_lock(hashtext('rsiweb-chain'), {chain.pk})\")\n"
        "        held.set()\n"
        f"        threading.Event().wait({hold_seconds})\n"
        "    connection.close()\n"
        "threading.Thread(target=hold, daemon=True).start()\n"
        "held.wait(30)\n"
        "with transaction.atomic():\n"
        f"    event = event_append(run=Run.objects.get(pk={run.pk}), type='test.left', actor='w', role='worker')\n"
        "print(event.pk, flush=True)\n" + ("os._exit(0)\n" if killed else ""),
        env={**child_env(), "RSI_EVENT_SEAL_BACKGROUND": "1"},
    )
    return int(child.stdout.split()[-1])
