"""Bad strings in data files: refused at registration with line and path, never stored, never a 500.

Generated per class (STYLE 31c): a lone surrogate (in a column, a key, a list item), NUL, the bare
tokens NaN / Infinity / -Infinity, an overflowing number, nesting beyond 64 levels and a row that
does not parse, at different lines, registered through the live REST endpoint (``worker_add_data``
from the workspace and from the catalog) and through the data-job service. A refused file leaves
no entry, no artifact and no staging copy, and the refusal is in the run's event chain. An entry
stored before these rules existed answers a clear 409 on inspection, for Workers and Reviewers.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings

from apps.core.errors import ApplicationError
from apps.datapool.models import DataEntry
from apps.datapool.services import data_register_from_job
from apps.datapool.storage import artifact_store, data_key
from apps.experiments.events import chain_key, chain_verify
from apps.experiments.models import Event
from apps.expos.workspaces import workspace_path
from apps.jobs.choices import JobKind
from apps.jobs.services import job_claim, job_enqueue
from tests.apps.expos.tools.conftest import CLEAN, build_world

GOOD = [json.dumps({"prompt": p, "completion": c}) for p, c in CLEAN[:4]]


def _nest(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def bad_rows() -> Iterator[tuple[str, str, str, str]]:
    """(label, one JSONL line, expected code, expected JSONPath or "" when the line does not parse)."""
    for escape in (r"\ud800", r"\udfff", r"\udc00\ud800"):
        yield (
            f"surrogate {escape} in the prompt",
            f'{{"prompt": "Q{escape}", "completion": " 1"}}',
            "bad_value",
            "$.prompt",
        )
        yield (
            f"surrogate {escape} in a key",
            f'{{"prompt": "Q", "completion": " 1", "{escape}": 0}}',
            "bad_value",
            f'$["{escape}"]',
        )
        yield (
            f"surrogate {escape} in a list item",
            f'{{"prompt": "Q", "completion": " 1", "tags": ["ok", "x{escape}"]}}',
            "bad_value",
            "$.tags[1]",
        )
    yield "NUL in the completion", r'{"prompt": "Q", "completion": " 1\u0000"}', "bad_value", "$.completion"
    yield (
        "NUL in a nested value",
        r'{"prompt": "Q", "completion": " 1", "meta": {"by": "\u0000"}}',
        "bad_value",
        "$.meta.by",
    )
    for token in ("NaN", "Infinity", "-Infinity"):
        yield f"bare {token}", f'{{"prompt": "Q", "completion": " 1", "score": {token}}}', "malformed_jsonl", "$.score"
    yield (
        "bare NaN in a list",
        '{"prompt": "Q", "completion": " 1", "scores": [0.5, NaN]}',
        "malformed_jsonl",
        "$.scores[1]",
    )
    yield "overflow", '{"prompt": "Q", "completion": " 1", "score": 1e999}', "malformed_jsonl", "$.score"
    # The row object is level 1, so "meta" with 64 levels of its own makes 65.
    yield "nesting 65", f'{{"prompt": "Q", "completion": " 1", "meta": {_nest(64)}}}', "bad_value", "$.meta" + ".a" * 63
    # A surrogate encoded as bytes (CESU-8) is not UTF-8 at all.
    yield "CESU-8 surrogate bytes", '{"prompt": "Q\ud800", "completion": " 1"}', "malformed_jsonl", ""
    yield "does not parse", '{"prompt": "Q", "completion": " 1"', "malformed_jsonl", ""
    yield "trailing garbage", '{"prompt": "Q", "completion": " 1"} x', "malformed_jsonl", ""


def bad_files() -> Iterator[tuple[str, str, int, str, str]]:
    """(label, file text, line of the bad row, code, path): each bad row first, in the middle and last."""
    for label, row, code, path in bad_rows():
        for line in (1, 3, len(GOOD) + 1):
            lines = [*GOOD]
            lines.insert(line - 1, row)
            yield f"{label} at line {line}", "\n".join(lines) + "\n", line, code, path


@pytest.fixture
def staging(tmp_path, monkeypatch):
    """Staging copies go to their own folder here, so a test can see that none is left behind."""
    folder = tmp_path / "staging"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def live_world(transactional_db, roots, staging):
    return build_world(roots)


@pytest.fixture
def send(live_call):
    def post(who: str, tool: str, body: dict[str, Any]) -> requests.Response:
        return live_call(who, tool, json=body)

    return post


def _artifacts() -> set[str]:
    root = Path(settings.ARTIFACT_ROOT)
    return {str(p) for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def _assert_refused(response: requests.Response, *, line: int, code: str, path: str, shown: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"].startswith(f"{shown} line {line}")
    assert error["detail"]["line"] == line
    if path:
        assert error["detail"]["path"] == path
        assert f"line {line}: {path}: " in error["message"]


def test_every_bad_file_variant_is_refused_at_registration_and_nothing_is_stored(send, live_world, staging):
    workspace = workspace_path(run=live_world.run, node=live_world.worker)
    entries, artifacts = DataEntry.objects.count(), _artifacts()
    registered = Event.objects.filter(type="data.registered").count()
    generated = list(bad_files())
    assert len(generated) >= 45
    failures = []
    for index, (label, text, line, code, path) in enumerate(generated):
        name = f"bad-{index}.jsonl"
        (workspace / name).write_text(text, encoding="utf-8", errors="surrogatepass")
        response = send("worker", "worker_add_data", {"path": name})
        try:
            _assert_refused(response, line=line, code=code, path=path, shown=name)
            recorded = Event.objects.filter(run=live_world.run, tool="worker_add_data").latest("pk").arguments
            assert recorded["status"] == 400
            assert recorded["error"] == code
            assert recorded["args"] == {"path": name}
        except (AssertionError, KeyError, ValueError) as exc:
            failures.append(f"{label}: {exc!r}"[:400])
    assert not failures, "\n".join(failures)
    assert DataEntry.objects.count() == entries
    assert _artifacts() == artifacts
    assert not any(staging.iterdir())
    assert Event.objects.filter(type="data.registered").count() == registered
    assert chain_verify(chain_key(live_world.run)).ok


def test_64_levels_in_a_row_register_and_65_do_not(send, live_world):
    workspace = workspace_path(run=live_world.run, node=live_world.worker)
    (workspace / "deep64.jsonl").write_text(f'{{"prompt": "Q", "completion": " 1", "meta": {_nest(63)}}}\n')
    (workspace / "deep65.jsonl").write_text(f'{{"prompt": "Q", "completion": " 1", "meta": {_nest(64)}}}\n')

    assert send("worker", "worker_add_data", {"path": "deep64.jsonl"}).status_code == 201
    refused = send("worker", "worker_add_data", {"path": "deep65.jsonl"})

    _assert_refused(refused, line=1, code="bad_value", path="$.meta" + ".a" * 63, shown="deep65.jsonl")
    assert "deeper than 64 levels" in refused.json()["error"]["message"]


@pytest.mark.parametrize(("label", "row", "code", "path"), list(bad_rows())[::3])
def test_a_bad_catalog_dataset_is_refused_with_line_and_path(send, live_world, roots, staging, label, row, code, path):
    folder = roots["catalog"] / "arith-bad"
    folder.mkdir()
    (folder / "data.jsonl").write_text("\n".join([*GOOD, row]) + "\n", encoding="utf-8", errors="surrogatepass")
    (folder / "meta.json").write_text(json.dumps({"name": "arith-bad", "format": "sft", "files": ["data.jsonl"]}))
    entries = DataEntry.objects.count()

    response = send("worker", "worker_add_data", {"catalog": "arith-bad"})

    _assert_refused(response, line=len(GOOD) + 1, code=code, path=path, shown="arith-bad/data.jsonl")
    assert DataEntry.objects.count() == entries
    assert not any(staging.iterdir())


def test_a_data_job_writing_bad_rows_registers_nothing(live_world, tmp_path, staging):
    job = job_claim(
        job_id=job_enqueue(kind=JobKind.DATA, spec={"op": "derive"}, run=live_world.run).pk, worker="default@host-a"
    )
    parent = DataEntry.objects.get(handle=live_world.clean)
    entries, artifacts = DataEntry.objects.count(), _artifacts()
    for index, (_label, row, code, path) in enumerate(bad_rows()):
        output = tmp_path / f"job-{index}.jsonl"
        output.write_text("\n".join([*GOOD, row]) + "\n", encoding="utf-8", errors="surrogatepass")
        with pytest.raises(ApplicationError) as refused:
            data_register_from_job(job=job, path=output, parents=[parent], name="derived")
        assert refused.value.code == code
        assert refused.value.status_code == 400
        assert refused.value.detail.get("path", "") == path
        assert refused.value.detail["line"] == len(GOOD) + 1
    assert DataEntry.objects.count() == entries
    assert _artifacts() == artifacts


def _legacy_entry(world: Any, tmp_path: Path, row: str) -> DataEntry:
    """An entry stored before the rules existed: its bytes hold a value registration now refuses."""
    text = "\n".join([*GOOD[:2], row, *GOOD[2:]]) + "\n"
    raw = text.encode("utf-8", "surrogatepass")
    source = tmp_path / "legacy.jsonl"
    source.write_bytes(raw)
    sha = hashlib.sha256(raw).hexdigest()
    store = artifact_store()
    store.put_file(source, key=data_key(sha))
    return DataEntry.objects.create(
        handle=f"data_{9000 + DataEntry.objects.count()}",
        name="legacy",
        uri=store.uri(data_key(sha)),
        sha256=sha,
        rows=5,
        size_bytes=len(raw),
        format="sft",
        schema={"prompt": "string", "completion": "string"},
        source_kind="workspace",
        source={"workspace_path": "legacy.jsonl"},
        run=world.run,
        registered_by=world.worker,
    )


@pytest.mark.parametrize(
    ("row", "path"),
    [
        (r'{"prompt": "Q\ud800", "completion": " 1"}', "$.prompt"),
        ('{"prompt": "Q", "completion": " 1", "score": NaN}', "$.score"),
        (r'{"prompt": "Q", "completion": " 1", "tags": ["\u0000"]}', "$.tags[0]"),
        ('{"prompt": "Q", "completion": ', ""),
    ],
)
def test_an_unreadable_stored_entry_answers_a_clear_error_and_others_still_inspect(
    send, live_world, tmp_path, row, path
):
    legacy = _legacy_entry(live_world, tmp_path, row)
    for who, tool in (("worker", "worker_inspect_data"), ("reviewer", "reviewer_inspect_data")):
        response = send(who, tool, {"data": legacy.handle, "rows": 5})
        assert response.status_code == 409, (tool, response.text)
        error = response.json()["error"]
        assert error["code"] == "data_unreadable"
        assert error["message"].startswith(f"{legacy.handle} (stored data) line 3")
        assert "register a corrected copy" in error["message"]
        if path:
            assert error["detail"]["path"] == path
        # The other entries are not affected.
        assert send(who, tool, {"data": live_world.clean}).status_code == 200
