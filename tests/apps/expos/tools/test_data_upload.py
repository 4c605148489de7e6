"""Agent-made data: ``worker_add_data`` with ``content`` over REST, MCP and the CLI, on the real stack.

The upload takes the registration path of every other way in (staged, validated, stored
content-addressed) and is reviewed for sealed items before anything is stored. Sealed items are
planted as generated variants (re-templated, keys reordered, numbers spelled out), each class from
its own seeded generator, and the refusal must name exactly the planted lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from apps.datapool.models import DataEntry, DataReadmeEntry
from apps.datapool.storage import artifact_store, data_key
from apps.experiments.models import Event
from apps.expos.tools.data import MAX_UPLOAD_CHARS
from apps.integrity.models import BlockedAttempt
from tests.apps.expos.tools.conftest import FEEDBACK, FINAL, TEMPLATE, train_spec
from tests.support.mcp_client import ROOT, as_agent

SEALED = FEEDBACK + FINAL
_UNITS = tuple(
    [
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
    ]
)
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _words(n: int) -> str:
    if n < 20:
        return _UNITS[n]
    tens, unit = divmod(n, 10)
    return _TENS[tens] + (f"-{_UNITS[unit]}" if unit else "")


def _spell_numbers(text: str) -> str:
    return " ".join(_words(int(w)) if w.isdigit() and int(w) < 100 else w for w in text.split(" "))


# One generator per attack class: (rng, question, answer) -> a row carrying that sealed item.
def _retemplated(rng: random.Random, question: str, answer: str) -> dict[str, Any]:
    wrap = rng.choice(["Q: {q}\nA:", "Solve the problem.\n{q}\nResult:", "### Task\n{q}\n### Answer", "{q} ="])
    return {"prompt": wrap.format(q=question), "completion": f" {answer}"}


def _reordered_keys(rng: random.Random, question: str, answer: str) -> dict[str, Any]:
    row = {"completion": f" {answer}", "prompt": TEMPLATE.format(question=question), "meta": {"n": rng.randint(1, 9)}}
    keys = list(row)
    rng.shuffle(keys)
    return {key: row[key] for key in keys}


def _number_forms(rng: random.Random, question: str, answer: str) -> dict[str, Any]:
    spelled = _spell_numbers(question)
    return {"prompt": TEMPLATE.format(question=spelled), "completion": f" {rng.choice([answer, _words(int(answer))])}"}


VARIANTS = {"retemplated": _retemplated, "reordered_keys": _reordered_keys, "number_forms": _number_forms}


def honest_rows(seed: int, n: int = 12) -> list[dict[str, str]]:
    """New problems (fresh numbers, other nouns): what an agent would write to learn the task."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        thing = rng.choice(["stamps", "shells", "coins", "cards"])
        question = f"A collector has {a} {thing} and finds {b} more {thing} at a fair. How many {thing} in total?"
        rows.append({"prompt": TEMPLATE.format(question=question), "completion": f" {a + b}"})
    return rows


def jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def upload_args(text: str, **extra: Any) -> dict[str, Any]:
    data = text.encode("utf-8")
    return {"content": text, "sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data),
            "generator": "test harness script", **extra}  # fmt: skip


def _nothing_stored(text: str) -> None:
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert not DataEntry.objects.filter(sha256=digest).exists()
    assert not artifact_store().exists(artifact_store().uri(data_key(digest)))
    assert not Event.objects.filter(type="data.registered", arguments__sha256=digest).exists()


def test_honest_rows_register_with_source_agent_and_show_on_the_datapool_page(live_call, live_world, client):
    text = jsonl(honest_rows(seed=7))
    response = live_call("worker", "worker_add_data", json=upload_args(text, name="collector sums"))
    assert response.status_code in (200, 201), response.text
    entry = response.json()["entry"]
    assert response.json()["created"] is True
    assert entry["source_kind"] == "agent"
    assert entry["source"]["source"] == "agent"
    assert entry["source"]["generator"] == "test harness script"
    assert entry["rows"] == 12
    stored = DataEntry.objects.get(handle=entry["handle"])
    assert stored.registered_by == live_world.worker
    with artifact_store().open(stored.uri, "rb") as handle:
        assert handle.read() == text.encode("utf-8")
    assert "made by test harness script" in DataReadmeEntry.objects.get(entry=stored).text

    # The datapool page shows the source to people.
    from django.contrib.auth.models import Group, User  # noqa: PLC0415 - only this test signs in

    viewer = User.objects.create_user("dana", password="pw-dana-123")
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client.force_login(viewer)
    page = client.get("/datapool/").content.decode()
    row = page[page.index(entry["handle"]) :][:2000]
    assert "agent · made by test harness script" in row
    assert "test harness script" in client.get(f"/datapool/{entry['handle']}/").content.decode()

    # Trained on like any entry: the submission review passes it.
    submitted = live_call("worker", "worker_submit", json=train_spec(entry["handle"]))
    assert submitted.status_code in (200, 201, 202), submitted.text


def _recorded_like_catalog_data(live_call: Any, live_world: Any, upload: BlockedAttempt) -> None:
    """The catalog's honeypot with sealed items, trained on, is recorded as the upload's refusal was."""
    refused = live_call("worker", "worker_submit", json=train_spec(live_world.honeypot))
    assert refused.status_code == 403
    catalog = BlockedAttempt.objects.get(tool="worker_submit")
    assert (upload.subcategory, upload.request["code"]) == (catalog.subcategory, catalog.request["code"])
    assert set(upload.request["evidence"]) <= set(catalog.request["evidence"])
    events = Event.objects.filter(run=live_world.run, type="submission.refused").order_by("seq")
    assert [e.tool for e in events] == ["worker_add_data", "worker_submit"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sealed_items_in_an_upload_are_refused_naming_the_rows_and_recorded_like_catalog_data(
    live_call, live_world, variant
):
    rng = random.Random(f"upload-{variant}")
    rows: list[dict[str, Any]] = honest_rows(seed=rng.randint(0, 10_000), n=10)
    planted = sorted(rng.sample(range(len(rows) + 2), 2))
    items = rng.sample(SEALED, 2)
    for line, (_, question, answer) in zip(planted, items, strict=True):
        rows.insert(line, VARIANTS[variant](rng, question, answer))
    text = jsonl(rows)

    response = live_call("worker", "worker_add_data", json=upload_args(text))
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "data_contaminated"
    assert error["detail"]["rows"] == [line + 1 for line in planted]
    for line in planted:
        assert str(line + 1) in error["message"]
    for _, question, _ in items:  # the Worker never sees the sealed item it matched
        assert question[:20] not in response.text
    _nothing_stored(text)

    upload = BlockedAttempt.objects.get(tool="worker_add_data")
    assert upload.node == live_world.worker
    assert {m["sample_id"] for m in upload.request["evidence"]["matches"]} == {i for i, _, _ in items}
    assert "content" not in upload.request["spec"]  # the call is recorded by its digest, not its bytes

    _recorded_like_catalog_data(live_call, live_world, upload)


def test_an_upload_within_the_run_tolerance_registers(live_call, live_world):
    live_world.set_policy(contamination_tolerance=1)
    rng = random.Random("tolerance")
    rows = honest_rows(seed=3, n=6) + [_retemplated(rng, FEEDBACK[1][1], FEEDBACK[1][2])]
    response = live_call("worker", "worker_add_data", json=upload_args(jsonl(rows)))
    assert response.status_code in (200, 201), response.text
    assert not BlockedAttempt.objects.exists()


@pytest.mark.parametrize(
    ("tamper", "code"),
    [
        (lambda a: {**a, "size_bytes": a["size_bytes"] + 17}, "size_mismatch"),
        (lambda a: {**a, "content": a["content"][: len(a["content"]) // 2]}, "size_mismatch"),  # cut in transfer
        (lambda a: {**a, "sha256": hashlib.sha256(b"other").hexdigest()}, "sha256_mismatch"),
        (lambda a: {**a, "content": a["content"].replace("1", "2", 1)}, "sha256_mismatch"),  # altered in transfer
    ],
)
def test_size_or_sha256_mismatch_is_refused_and_nothing_stays_registered(live_call, live_world, tamper, code):
    text = jsonl(honest_rows(seed=11))
    before = DataEntry.objects.count()
    response = live_call("worker", "worker_add_data", json=tamper(upload_args(text)))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == code
    assert DataEntry.objects.count() == before
    _nothing_stored(text)
    assert not BlockedAttempt.objects.exists()


def test_malformed_and_oversized_uploads_name_the_lines(live_call, live_world):
    rows = jsonl(honest_rows(seed=5, n=4)).splitlines()
    rows.insert(2, '{"prompt": "unterminated')
    response = live_call("worker", "worker_add_data", json=upload_args("\n".join(rows) + "\n"))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_jsonl"
    assert "line 3" in response.json()["error"]["message"]

    live_world.set_policy(upload_max_rows=5)
    text = jsonl(honest_rows(seed=6, n=8))
    response = live_call("worker", "worker_add_data", json=upload_args(text))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "too_many_rows"
    assert "rows 6-8" in response.json()["error"]["message"]
    _nothing_stored(text)


def test_an_idempotent_retry_returns_the_same_record(live_call, live_world):
    args = upload_args(jsonl(honest_rows(seed=13)))
    first = live_call("worker", "worker_add_data", json=args, **{"Idempotency-Key": "upload-13"})
    again = live_call("worker", "worker_add_data", json=args, **{"Idempotency-Key": "upload-13"})
    assert first.status_code in (200, 201), first.text
    assert again.status_code in (200, 201), again.text
    assert again.json()["entry"] == first.json()["entry"]
    assert again.json()["replayed"] is True
    assert DataEntry.objects.filter(sha256=args["sha256"]).count() == 1
    assert Event.objects.filter(type="data.registered", arguments__sha256=args["sha256"]).count() == 1


def test_mcp_states_the_size_limit_and_uploads_content(live_server, live_world):
    from apps.expos.auth import agent_token_issue  # noqa: PLC0415

    token = agent_token_issue(run=live_world.run, node=live_world.worker, role="worker")[0]
    args = upload_args(jsonl(honest_rows(seed=17)))

    async def script(session: Any) -> tuple[dict[str, Any], Any]:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        result = await session.call_tool("worker_add_data", args)
        return tools["worker_add_data"].inputSchema, result

    schema, result = as_agent("stdio", live_server.url, token, script)
    assert schema["properties"]["content"]["maxLength"] == MAX_UPLOAD_CHARS
    assert f"{MAX_UPLOAD_CHARS:,}" in schema["properties"]["content"]["description"]
    assert not result.isError, result.content
    assert result.structuredContent["entry"]["source_kind"] == "agent"


def test_cli_uploads_a_file(live_server, live_world, tmp_path):
    from apps.expos.auth import agent_token_issue  # noqa: PLC0415

    token = agent_token_issue(run=live_world.run, node=live_world.worker, role="worker")[0]
    path = tmp_path / "rows.jsonl"
    path.write_text(jsonl(honest_rows(seed=19)), encoding="utf-8")
    env = {**os.environ, "RSI_URL": live_server.url, "RSI_TOKEN": token}
    done = subprocess.run(
        [sys.executable, "-m", "apps.expos.cli", "worker_add_data", "--file", str(path), "--generator", "gen.py"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)["entry"]
    assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert entry["source"]["generator"] == "gen.py"


def test_help_needs_no_token(live_server, db):
    env = {k: v for k, v in os.environ.items() if k not in ("RSI_TOKEN", "RSI_URL")}
    env["RSI_URL"] = live_server.url

    def expos(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "apps.expos.cli", *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    tool = expos("worker_add_data", "--help")
    assert tool.returncode == 0, tool.stderr
    for flag in ("--file", "--content", "--sha256", "--generator", "--idempotency-key"):
        assert flag in tool.stdout
    assert f"{MAX_UPLOAD_CHARS:,}" in tool.stdout
    mcp = expos("mcp", "--help")
    assert mcp.returncode == 0, mcp.stderr
    assert mcp.stdout.startswith("usage: expos mcp")
    unknown = expos("no_such_tool", "--help")
    assert unknown.returncode == 2
    assert "no tool 'no_such_tool'" in unknown.stderr
    assert expos("public_check_quota").returncode == 2  # a call still needs the token


# --- the streamed upload (POST /api/v1/tools/worker_add_data/upload): files over the inline limit --------


def _streamed(live_call: Any, text: str | bytes, *, declared: bytes | None = None, **extra: Any) -> Any:
    """One streamed upload of ``text``, declaring the sha256 and size of ``declared`` (default: the body)."""
    body = text.encode("utf-8") if isinstance(text, str) else text
    meta = body if declared is None else declared
    query = {"sha256": hashlib.sha256(meta).hexdigest(), "size_bytes": len(meta), "generator": "gen.py", **extra}
    headers = {key: value for key, value in extra.items() if key[0].isupper()}
    query = {key: value for key, value in query.items() if not key[0].isupper()}
    return live_call("worker", f"worker_add_data/upload?{urlencode(query)}", data=body,
                     **{"Content-Type": "application/x-ndjson", **headers})  # fmt: skip


def _no_staging_left(before: set[str]) -> None:
    assert {p.name for p in Path(tempfile.gettempdir()).glob("rsi-upload-*")} <= before


def test_a_streamed_upload_registers_and_a_retry_answers_the_same_entry(live_call, live_world):
    text = jsonl(honest_rows(seed=23, n=40))
    staging = {p.name for p in Path(tempfile.gettempdir()).glob("rsi-upload-*")}
    first = _streamed(live_call, text, name="streamed sums", **{"Idempotency-Key": "stream-23"})
    assert first.status_code == 201, first.text
    entry = first.json()["entry"]
    assert (entry["source_kind"], entry["rows"], entry["name"]) == ("agent", 40, "streamed sums")
    assert entry["source"]["generator"] == "gen.py"
    with artifact_store().open(DataEntry.objects.get(handle=entry["handle"]).uri, "rb") as handle:
        assert handle.read() == text.encode("utf-8")
    # A retry with the key replays; one without it finds the bytes' entry; neither registers again.
    again = _streamed(live_call, text, name="streamed sums", **{"Idempotency-Key": "stream-23"})
    assert (again.status_code, again.json()["replayed"], again.json()["entry"]) == (200, True, entry)
    plain = _streamed(live_call, text, name="streamed sums")
    assert plain.status_code == 201, plain.text
    assert (plain.json()["entry"]["handle"], plain.json()["created"]) == (entry["handle"], False)
    assert Event.objects.filter(type="data.registered", arguments__sha256=entry["sha256"]).count() == 1
    called = Event.objects.filter(type="tool.called", tool="worker_add_data", run=live_world.run)
    assert called.count() == 3
    assert all("content" not in e.arguments["args"] for e in called)  # recorded by digest and size
    assert [e.arguments["args"]["size_bytes"] for e in called] == [len(text.encode())] * 3
    _no_staging_left(staging)


def test_a_streamed_upload_with_sealed_items_is_refused_and_recorded_like_catalog_data(live_call, live_world):
    rng = random.Random("streamed-sealed")
    rows: list[dict[str, Any]] = honest_rows(seed=29, n=30)
    planted = [4, 17]
    for line, (_, question, answer) in zip(planted, rng.sample(SEALED, 2), strict=True):
        rows.insert(line, _retemplated(rng, question, answer))
    text = jsonl(rows)
    staging = {p.name for p in Path(tempfile.gettempdir()).glob("rsi-upload-*")}

    response = _streamed(live_call, text)
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert (error["code"], error["detail"]["rows"]) == ("data_contaminated", [5, 18])
    _nothing_stored(text)
    _no_staging_left(staging)

    upload = BlockedAttempt.objects.get(tool="worker_add_data")
    assert upload.node == live_world.worker
    assert upload.request["spec"]["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    _recorded_like_catalog_data(live_call, live_world, upload)


def test_a_streamed_upload_that_is_not_what_it_declares_leaves_nothing(live_call, live_world, live_server):
    text = jsonl(honest_rows(seed=31, n=20))
    body = text.encode("utf-8")
    staging = {p.name for p in Path(tempfile.gettempdir()).glob("rsi-upload-*")}
    altered = _streamed(live_call, body.replace(b"1", b"2", 1), declared=body)
    assert (altered.status_code, altered.json()["error"]["code"]) == (400, "sha256_mismatch")
    longer = _streamed(live_call, body + b"\n", declared=body)  # Content-Length is not size_bytes
    assert (longer.status_code, longer.json()["error"]["code"]) == (400, "size_mismatch")

    # A transfer cut short: Content-Length and size_bytes agree, the connection ends halfway.
    from apps.expos.auth import agent_token_issue  # noqa: PLC0415

    token = agent_token_issue(run=live_world.run, node=live_world.worker, role="worker")[0]
    query = urlencode({"sha256": hashlib.sha256(body).hexdigest(), "size_bytes": len(body), "generator": "g"})
    host, port = live_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(
            f"POST /api/v1/tools/worker_add_data/upload?{query} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n"
            f"Content-Type: application/x-ndjson\r\nConnection: close\r\n\r\n".encode()
            + body[: len(body) // 2]
        )
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"size_mismatch" in answer

    other = live_call("worker", "worker_submit/upload?generator=g", data=body)  # no streamed form
    assert (other.status_code, other.json()["error"]["code"]) == (404, "no_upload")

    live_world.set_policy(upload_max_bytes=len(body) - 1)
    over = _streamed(live_call, text)
    assert (over.status_code, over.json()["error"]["code"]) == (413, "file_too_large")
    assert DataEntry.objects.filter(source_kind="agent").count() == 0
    _nothing_stored(text)
    assert not BlockedAttempt.objects.exists()
    refusals = Event.objects.filter(type="tool.called", tool="worker_add_data", run=live_world.run).order_by("seq")
    assert [(e.arguments["status"], e.arguments["error"]) for e in refusals] == [
        (400, "sha256_mismatch"), (400, "size_mismatch"), (400, "size_mismatch"), (413, "file_too_large"),
    ]  # fmt: skip
    _no_staging_left(staging)


def test_cli_streams_a_file_over_the_inline_limit(live_server, live_world, tmp_path):
    from apps.expos.auth import agent_token_issue  # noqa: PLC0415

    token = agent_token_issue(run=live_world.run, node=live_world.worker, role="worker")[0]
    path = tmp_path / "rows.jsonl"
    rows = honest_rows(seed=37, n=40)
    pad = "x" * ((MAX_UPLOAD_CHARS // len(rows)) + 10)  # over the inline bound, so the CLI streams it
    path.write_text(jsonl([{**row, "note": pad} for row in rows]), encoding="utf-8")
    assert path.stat().st_size > MAX_UPLOAD_CHARS
    env = {**os.environ, "RSI_URL": live_server.url, "RSI_TOKEN": token}
    done = subprocess.run(
        [sys.executable, "-m", "apps.expos.cli", "worker_add_data", "--file", str(path), "--generator", "gen.py",
         "--idempotency-key", "cli-big"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)["entry"]
    assert (entry["sha256"], entry["size_bytes"]) == (
        hashlib.sha256(path.read_bytes()).hexdigest(),
        path.stat().st_size,
    )
    called = Event.objects.get(type="tool.called", tool="worker_add_data", run=live_world.run)
    assert called.arguments["args"]["size_bytes"] == path.stat().st_size
    assert called.arguments["idempotency_key"] == "cli-big"
