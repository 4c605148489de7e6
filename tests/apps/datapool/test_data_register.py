"""Registering data from a workspace: what is stored, what is refused, and that refusals leave nothing."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.db import DatabaseError, connection, connections, transaction

from apps.core.errors import ApplicationError
from apps.datapool.models import DataEntry, DataReadmeEntry, DataUsage
from apps.datapool.selectors import data_entry_get, data_entry_list, data_readme, data_rows
from apps.datapool.services import (
    data_readme_append,
    data_register_from_workspace,
    data_transform,
    data_usage_record,
)
from apps.datapool.storage import artifact_store, data_key
from apps.experiments.models import Event
from apps.experiments.services import experiment_create
from apps.research.models import ResearchNode
from apps.research.services import node_create
from tests.apps.benchmarks.minibench_fixture import write_jsonl
from tests.support.procs import run_python, sqlite_env

pytestmark = pytest.mark.django_db

ROWS = [{"prompt": f"Question: What is {i} plus 1?\nAnswer:", "completion": f" {i + 1}"} for i in range(5)]
ROOT = Path(__file__).resolve().parents[3]


def stored_files(root: Path) -> list[str]:
    """Every file under the artifact root (temporary ones included)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if root.exists() else []


def register(workspace, path, **kwargs):
    kwargs.setdefault("name", "train")
    return data_register_from_workspace(workspace=workspace, path=path, **kwargs)


def test_register_copies_into_the_content_addressed_store(artifact_root, workspace):
    source = write_jsonl(workspace / "data" / "train.jsonl", ROWS)
    sha = hashlib.sha256(source.read_bytes()).hexdigest()

    entry = register(workspace, "data/train.jsonl", teacher="", note="five toy rows")

    assert entry.handle == "data_0001"
    assert entry.sha256 == sha
    assert (entry.rows, entry.size_bytes, entry.format) == (5, source.stat().st_size, "sft")
    assert entry.schema == {"completion": "string", "prompt": "string"}
    assert entry.source_kind == "workspace"
    assert entry.source == {"workspace_path": "data/train.jsonl"}
    assert stored_files(artifact_root) == [data_key(sha)]
    assert entry.uri == artifact_store().uri(data_key(sha))
    assert data_rows(entry, limit=2) == ROWS[:2]
    [note] = data_readme(entry)
    assert "data/train.jsonl" in note.text
    assert "five toy rows" in note.text
    event = Event.objects.get(type="data.registered")
    assert event.arguments["sha256"] == sha
    assert event.result_ref == f"data:{entry.uuid}"


def test_dpo_format_is_inferred_and_handles_count_up(artifact_root, workspace):
    write_jsonl(workspace / "a.jsonl", ROWS)
    write_jsonl(workspace / "prefs.jsonl", [{"prompt": "p", "chosen": " 1", "rejected": " 2", "score": 0.5}])
    first = register(workspace, "a.jsonl")
    second = register(workspace, "./prefs.jsonl", name="prefs")
    assert second.handle == "data_0002"
    assert second.format == "dpo"
    assert second.schema == {"chosen": "string", "prompt": "string", "rejected": "string", "score": "number"}
    assert [e.handle for e in data_entry_list()] == [first.handle, second.handle]
    assert data_entry_get("data_0002") == second == data_entry_get(str(second.uuid))
    with pytest.raises(ApplicationError) as missing:
        data_entry_get("data_0404")
    assert missing.value.code == "data_not_found"


def test_identical_bytes_return_the_existing_entry_with_a_readme_line(artifact_root, workspace):
    write_jsonl(workspace / "a.jsonl", ROWS)
    write_jsonl(workspace / "copy" / "b.jsonl", ROWS)
    first = register(workspace, "a.jsonl")
    again = register(workspace, "copy/b.jsonl", name="same bytes, other name")
    assert again.pk == first.pk
    assert DataEntry.objects.count() == 1
    notes = list(data_readme(first))
    assert len(notes) == 2
    assert "copy/b.jsonl" in notes[1].text
    assert len(stored_files(artifact_root)) == 1
    assert Event.objects.filter(type="data.reregistered").count() == 1


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("../outside.jsonl", "path_escape"),
        ("data/../../outside.jsonl", "path_escape"),
        ("/etc/passwd", "absolute_path"),
        ("~/outside.jsonl", "absolute_path"),
        ("", "invalid_path"),
        (".", "invalid_path"),
        ("missing.jsonl", "not_found"),
    ],
)
def test_paths_that_leave_the_workspace_are_refused(artifact_root, workspace, path, code):
    write_jsonl(workspace.parent / "outside.jsonl", ROWS)
    with pytest.raises(ApplicationError) as refused:
        register(workspace, path)
    assert refused.value.code == code
    assert refused.value.message
    assert DataEntry.objects.count() == 0
    assert stored_files(artifact_root) == []


def test_symlinked_file_is_refused_even_when_it_points_inside(artifact_root, workspace):
    outside = write_jsonl(workspace.parent / "secret.jsonl", ROWS)
    inside = write_jsonl(workspace / "real.jsonl", ROWS)
    (workspace / "escape.jsonl").symlink_to(outside)
    (workspace / "alias.jsonl").symlink_to(inside)
    for path in ("escape.jsonl", "alias.jsonl"):
        with pytest.raises(ApplicationError) as refused:
            register(workspace, path)
        assert refused.value.code == "symlink_in_path"
        assert path in refused.value.message
    assert DataEntry.objects.count() == 0
    assert stored_files(artifact_root) == []


def test_symlinked_parent_directory_is_refused(artifact_root, workspace):
    elsewhere = workspace.parent / "elsewhere"
    write_jsonl(elsewhere / "train.jsonl", ROWS)
    (workspace / "data").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ApplicationError) as refused:
        register(workspace, "data/train.jsonl")
    assert refused.value.code == "symlink_in_path"
    assert "'data'" in refused.value.message
    assert DataEntry.objects.count() == 0
    assert stored_files(artifact_root) == []


def test_directories_and_fifos_are_not_files(artifact_root, workspace):
    (workspace / "folder.jsonl").mkdir()
    os.mkfifo(workspace / "pipe.jsonl")
    for path in ("folder.jsonl", "pipe.jsonl"):
        with pytest.raises(ApplicationError) as refused:
            register(workspace, path)
        assert refused.value.code == "not_a_file"
    assert stored_files(artifact_root) == []


@pytest.mark.parametrize(
    ("content", "code", "fragment"),
    [
        (b"", "empty_file", "empty"),
        (b'{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": \n', "malformed_jsonl", "line 2"),
        (b'{"prompt": "a", "completion": "b"}\n\n{"prompt": "c", "completion": "d"}\n', "blank_line", "line 2"),
        (b'{"prompt": "a", "completion": "b"}\n["a", "b"]\n', "not_an_object", "line 2 is a JSON array"),
        (b'{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n', "missing_columns", "line 2 lacks completion"),
        (b'{"prompt": "a", "completion": 7}\n', "bad_column_type", "completion must be text"),
        (b'{"question": "a", "answer": "b"}\n', "unknown_format", "line 1"),
        (b'{"prompt": "a", "completion": "\xff"}\n', "malformed_jsonl", "not UTF-8"),
    ],
)
def test_bad_files_are_refused_with_the_line_named(artifact_root, workspace, content, code, fragment):
    (workspace / "bad.jsonl").write_bytes(content)
    with pytest.raises(ApplicationError) as refused:
        register(workspace, "bad.jsonl")
    assert refused.value.code == code
    assert fragment in refused.value.message
    assert DataEntry.objects.count() == 0
    assert stored_files(artifact_root) == []


def test_declared_format_must_match_the_rows(artifact_root, workspace):
    write_jsonl(workspace / "a.jsonl", ROWS)
    with pytest.raises(ApplicationError) as refused:
        register(workspace, "a.jsonl", format="dpo")
    assert refused.value.code == "missing_columns"
    assert "line 1 lacks chosen, rejected" in refused.value.message


def _drop_file_capabilities() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: out of the bounding set
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def test_unreadable_file_is_refused(artifact_root, workspace):
    write_jsonl(workspace / "locked.jsonl", ROWS)
    (workspace / "locked.jsonl").chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(ApplicationError) as refused:
            register(workspace, "locked.jsonl")
        assert refused.value.code == "unreadable"
        return
    # Root reads any file: run the same service in a child process that gave up the two
    # capabilities that let root ignore file permissions (it fails before touching the database).
    script = (
        "import django, json; django.setup()\n"
        "from apps.core.errors import ApplicationError\n"
        "from apps.datapool.services import data_register_from_workspace\n"
        "try:\n"
        f"    data_register_from_workspace(workspace={str(workspace)!r}, path='locked.jsonl', name='x')\n"
        "except ApplicationError as exc:\n"
        "    print(json.dumps({'code': exc.code, 'message': exc.message}))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "rsiweb.settings.test", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        preexec_fn=_drop_file_capabilities,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    refused = json.loads(result.stdout.strip().splitlines()[-1])
    assert refused["code"] == "unreadable"
    assert "permission denied" in refused["message"]
    assert stored_files(artifact_root) == []


def test_a_failed_insert_removes_the_copied_artifact(artifact_root, workspace):
    write_jsonl(workspace / "a.jsonl", ROWS)
    # teacher is checked by the model (max 200 characters), i.e. after the bytes were copied.
    with pytest.raises(ValidationError):
        register(workspace, "a.jsonl", teacher="t" * 300)
    assert DataEntry.objects.count() == 0
    assert DataReadmeEntry.objects.count() == 0
    assert stored_files(artifact_root) == []


def test_readme_is_append_only_at_the_database(artifact_root, workspace):
    write_jsonl(workspace / "a.jsonl", ROWS)
    entry = register(workspace, "a.jsonl")
    note = data_readme_append(entry=entry, author="worker_0001", text="Filtered by hand; 0 rows dropped.")
    assert [n.text for n in data_readme(entry)][-1] == "Filtered by hand; 0 rows dropped."
    with pytest.raises(DatabaseError), transaction.atomic():
        DataReadmeEntry.objects.filter(pk=note.pk).update(text="rewritten history")
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM datapool_datareadmeentry WHERE id = %s", [note.pk])
    note.refresh_from_db()
    assert note.text == "Filtered by hand; 0 rows dropped."
    with pytest.raises(ApplicationError) as empty:
        data_readme_append(entry=entry, author="worker_0001", text="   ")
    assert empty.value.code == "empty_text"


@pytest.mark.parametrize(
    "change",
    [
        {"sha256": "0" * 64},
        {"uri": "file:///elsewhere.jsonl"},
        {"rows": 1},
        {"teacher": ""},
        {"teacher": "gpt-x"},
        {"source": {"path": "other.jsonl"}},
        {"schema": {"prompt": "string"}},
        {"name": "renamed"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_a_registered_entry_cannot_change(artifact_root, workspace, change):
    write_jsonl(workspace / "a.jsonl", ROWS)
    entry = register(workspace, "a.jsonl")
    before = DataEntry.objects.filter(pk=entry.pk).values().get()
    with pytest.raises(DatabaseError), transaction.atomic():
        DataEntry.objects.filter(pk=entry.pk).update(**change)
    assert DataEntry.objects.filter(pk=entry.pk).values().get() == before


def test_the_lineage_links_of_an_entry_cannot_change(artifact_root, workspace):
    write_jsonl(workspace / "a.jsonl", ROWS)
    write_jsonl(workspace / "b.jsonl", ROWS[:1])
    parent = register(workspace, "a.jsonl")
    other = register(workspace, "b.jsonl")
    child = data_transform(op="filter", inputs=[parent], params={"column": "completion", "regex": "[2-4]"})
    links = DataEntry.parents.through.objects.filter(from_dataentry=child)
    assert list(links.values_list("to_dataentry", flat=True)) == [parent.pk]
    with pytest.raises(DatabaseError), transaction.atomic():
        links.update(to_dataentry=other)
    with pytest.raises(DatabaseError), transaction.atomic():
        child.parents.clear()
    assert list(child.parents.all()) == [parent]


def test_usage_is_recorded_once_per_experiment(artifact_root, workspace, run):
    main = ResearchNode.objects.get(run=run, kind="main")
    worker = node_create(run=run, kind="worker", task="add numbers", actor=main.handle)
    experiment = experiment_create(
        run=run, owner=worker, kind="train_eval", input_checkpoint=run.base_checkpoint, action={"recipe": "sft"}
    )
    write_jsonl(workspace / "a.jsonl", ROWS)
    entry = register(workspace, "a.jsonl", run=run, node=worker)
    assert entry.run == run
    assert entry.registered_by == worker
    first = data_usage_record(entry=entry, experiment=experiment, purpose="train")
    again = data_usage_record(entry=entry, experiment=experiment, purpose="train")
    assert first.pk == again.pk
    assert DataUsage.objects.count() == 1
    assert Event.objects.filter(run=run, type="data.used").count() == 1


def test_memory_filesystem_store_works_end_to_end(memory_root, workspace):
    write_jsonl(workspace / "a.jsonl", ROWS)
    entry = register(workspace, "a.jsonl")
    assert entry.uri.startswith("memory://")
    store = artifact_store()
    assert store.exists(entry.uri)
    assert data_rows(entry, limit=10) == ROWS
    local = store.local_path(entry.uri)
    assert local.read_bytes() == (workspace / "a.jsonl").read_bytes()


@pytest.mark.django_db(transaction=True)
def test_concurrent_registrations_get_distinct_handles_and_share_identical_bytes(artifact_root, workspace):

    for i in range(4):
        write_jsonl(workspace / f"part{i}.jsonl", [{"prompt": f"p{i}", "completion": f"c{i}"}])
    write_jsonl(workspace / "dup.jsonl", [{"prompt": "p0", "completion": "c0"}])

    def work(path):
        try:
            return register(workspace, path).handle
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=5) as pool:
        handles = list(pool.map(work, ["part0.jsonl", "part1.jsonl", "part2.jsonl", "part3.jsonl", "dup.jsonl"]))

    assert sorted(set(handles)) == ["data_0001", "data_0002", "data_0003", "data_0004"]
    assert handles[0] == handles[4]  # identical bytes: one entry, however the race went
    assert DataEntry.objects.count() == 4
    assert len(stored_files(artifact_root)) == 4


def test_a_file_over_the_limit_is_refused_before_any_byte_is_copied(artifact_root, workspace, tmp_path, monkeypatch):
    """A 2 GiB sparse file (no disk used) is refused on its size: no staging copy, no artifact, no row."""
    from apps.datapool.services import MAX_DATA_BYTES  # noqa: PLC0415

    big = workspace / "data" / "huge.jsonl"
    big.parent.mkdir(parents=True, exist_ok=True)
    with big.open("wb") as handle:
        handle.write(b'{"prompt": "p", "completion": "c"}\n')
        handle.truncate(2 * MAX_DATA_BYTES)
    staging_root = tmp_path / "staging"
    staging_root.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(staging_root))  # where a staging copy would go
    before = stored_files(artifact_root)

    with pytest.raises(ApplicationError) as refused:
        register(workspace, "data/huge.jsonl")

    assert refused.value.code == "file_too_large"
    assert refused.value.status_code < 500
    assert refused.value.detail["size"] == 2 * MAX_DATA_BYTES
    assert list(staging_root.iterdir()) == []  # not even a staging folder: nothing was copied
    assert stored_files(artifact_root) == before
    assert not DataEntry.objects.exists()


SQLITE_GUARDS = """
import os
from pathlib import Path
from django.core.management import call_command
call_command("migrate", verbosity=0)
from apps.datapool.services import data_register_from_workspace
workspace = Path(os.environ["RSI_DATA_DIR"]) / "ws"
workspace.mkdir()
(workspace / "d.jsonl").write_text('{"prompt": "a", "completion": "b"}\\n')
print(data_register_from_workspace(workspace=workspace, path="d.jsonl", name="d").pk)
"""


def test_sqlite_keeps_the_entry_guards_after_the_chat_format_migration(tmp_path: Path):
    # datapool 0005 changes the format and source constraints: SQLite rebuilds the table, and the
    # guards of 0003 and 0004 are installed again on the copy.
    made = run_python(SQLITE_GUARDS, env=sqlite_env(tmp_path), timeout=180)
    pk = int(made.stdout.strip().splitlines()[-1])
    db = sqlite3.connect(tmp_path / "rsiweb.sqlite3")
    for statement in ("UPDATE datapool_dataentry SET name = 'renamed'", "DELETE FROM datapool_dataentry"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute(statement)
    assert db.execute("SELECT count(*) FROM datapool_dataentry WHERE id = ?", (pk,)).fetchone() == (1,)
    with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint"):
        db.execute(
            "INSERT INTO datapool_dataentry (uuid, created_at, updated_at, handle, name, uri, sha256, rows, size_bytes,"
            " format, schema, source_kind, source, teacher) VALUES ('u', datetime('now'), datetime('now'), 'h', 'n',"
            " 'x', 's', 1, 1, 'csv', '{}', 'export', '{}', '')"
        )
