"""Slow creations meet an MCP client with a 10 s timeout (issue 31, item 6).

The choice: the review runs inside the call and its latency is stated in the tool descriptions;
a client whose timeout is shorter retries with the same idempotency key. The MCP SDK's Python
client does not extend a timeout on progress notifications (``anyio.fail_after`` around the whole
request), so progress would not have helped; a pending record would have split one reviewed
creation in two. What makes the retry work: while the first call runs, a retry with its key is
answered at once with 409 ``in_progress`` (the first call holds the key for its transaction), and
once the first call has committed, the retry replays its answer. Every call here goes through the
SDK's own client (``expos mcp`` on stdio) to the live server, with ``read_timeout_seconds`` 10.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from datetime import timedelta
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import McpError

from apps.datapool.models import DataEntry
from apps.experiments.models import Experiment
from apps.expos.auth import agent_token_issue
from apps.expos.registry import Role, load_all
from tests.apps.expos.tools.conftest import train_spec
from tests.support.mcp_client import mcp_session

TIMEOUT = timedelta(seconds=10)
ROWS = 14_000  # about 0.9 M characters: the most one call's content may hold (MAX_UPLOAD_CHARS)


def _rows(n: int, seed: int) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b = rng.randrange(1000, 99999), rng.randrange(1000, 99999)
        lines.append(json.dumps({"prompt": f"Compute {a} plus {b}.", "completion": f" {a + b}"}))
    return "\n".join(lines) + "\n"


def _upload(content: str, key: str) -> dict[str, Any]:
    raw = content.encode()
    return {"content": content, "sha256": hashlib.sha256(raw).hexdigest(), "size_bytes": len(raw),
            "generator": "test script, seeded", "name": key, "idempotency_key": key}  # fmt: skip


def _answer(result: Any) -> tuple[bool, dict[str, Any]]:
    return bool(result.isError), result.structuredContent or {}


async def _create(session: ClientSession, tool: str, arguments: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A creating call as a client with a 10 s timeout makes it: on its own timeout or a 409
    in_progress it retries with the same idempotency key until it has an answer. Returns each
    attempt's outcome ("answer", "refused", "in_progress", "timeout") and body."""
    attempts: list[tuple[str, dict[str, Any]]] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            result = await session.call_tool(tool, arguments, read_timeout_seconds=TIMEOUT)
        except McpError as exc:  # the client gave up; the server goes on with the call
            if "Timed out" not in exc.error.message:
                raise
            attempts.append(("timeout", {}))
            continue
        body = result.structuredContent or {}
        if not result.isError:
            attempts.append(("answer", body))
            return attempts
        if body["error"]["code"] != "in_progress":
            attempts.append(("refused", body))
            return attempts
        attempts.append(("in_progress", body))
        await anyio.sleep(body["error"]["detail"]["retry_after_seconds"])
    raise AssertionError(f"no answer in 180 s: {attempts}")


@pytest.fixture
def token(live_world) -> str:
    return agent_token_issue(run=live_world.run, node=live_world.worker, role=Role.WORKER)[0]


def test_the_descriptions_state_the_latency_and_the_retry():
    for name in ("worker_submit", "worker_add_data"):
        description = load_all()[name].description
        assert "Latency:" in description, name
        assert "in_progress" in description, name
        assert "same Idempotency-Key" in description, name


def test_minibench_creations_reach_a_client_with_a_10_s_timeout(live_server, live_world, token):
    """Agent-made rows (2,000, the minibench's size) registered, then trained on, by a client that
    gives up after 10 s and retries as the descriptions say: each creation answers, once."""

    async def main() -> list[list[tuple[str, dict[str, Any]]]]:
        async with mcp_session("stdio", live_server.url, token) as session:
            added = await _create(session, "worker_add_data", _upload(_rows(2000, 1), "rows-2k"))
            handle = added[-1][1]["entry"]["handle"]
            submit = {**train_spec(handle), "idempotency_key": "sft-2k"}
            return [added, await _create(session, "worker_submit", submit)]

    added, submitted = anyio.run(main)
    print("attempts:", [[kind for kind, _ in calls] for calls in (added, submitted)])
    assert [added[-1][0], submitted[-1][0]] == ["answer", "answer"], (added[-1], submitted[-1])
    entry = added[-1][1]["entry"]
    assert entry["rows"] == 2000
    assert DataEntry.objects.filter(sha256=entry["sha256"]).count() == 1
    experiment = Experiment.objects.get(uuid=submitted[-1][1]["uuid"])
    assert experiment.action["data"] == [entry["handle"]]
    assert Experiment.objects.filter(owner=live_world.worker).count() == 1  # retried, never created twice


def test_a_retry_while_the_call_runs_is_told_in_progress_then_gets_the_answer(live_server, live_world, token):
    """Two calls with one key at once (a client that gave up, and its retry): one reviews the rows,
    the other is refused with 409 in_progress (nothing done twice) until its retry replays."""
    arguments = _upload(_rows(ROWS, 2), "rows-big")

    async def main() -> list[list[tuple[str, dict[str, Any]]]]:
        seen: list[list[tuple[str, dict[str, Any]]]] = []
        async with (
            mcp_session("stdio", live_server.url, token) as a,
            mcp_session("stdio", live_server.url, token) as b,
        ):

            async def client(session: ClientSession) -> None:
                seen.append(await _create(session, "worker_add_data", arguments))

            async with anyio.create_task_group() as group:
                group.start_soon(client, a)
                group.start_soon(client, b)
        return seen

    seen = anyio.run(main)
    print("attempts:", [[kind for kind, _ in calls] for calls in seen])
    kinds = [kind for calls in seen for kind, _ in calls]
    assert "in_progress" in kinds, f"the calls did not overlap: {kinds}"
    answers = [calls[-1][1] for calls in seen]
    assert [calls[-1][0] for calls in seen] == ["answer", "answer"]
    assert any(a.get("replayed") for a in answers)  # a retry got the first call's answer
    assert {a["entry"]["handle"] for a in answers} == {answers[0]["entry"]["handle"]}
    assert answers[0]["entry"]["rows"] == ROWS
    assert DataEntry.objects.filter(sha256=arguments["sha256"]).count() == 1
