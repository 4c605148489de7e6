"""The MCP server (apps/expos/mcp_server.py) through the SDK's own client, over both transports.

stdio: the ``expos mcp`` console script as a subprocess, calling the live server's REST API.
streamable HTTP: rsiweb/asgi.py's ``application`` (the mount at /api/v1/mcp beside Django) served by
uvicorn in this process, on the world's committed rows.

The MCP side runs in ``anyio.run`` (the client is async); the assertions read the database after it.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tomllib

import httpx
from django.core.management import call_command
from mcp import ClientSession, types
from mcp.shared.exceptions import McpError

from apps.experiments.models import Event
from apps.expos.mcp_server import IDEMPOTENCY_ARGUMENT, IF_MATCH_ARGUMENT, MCP_PATH
from apps.expos.registry import tools_for_role
from apps.integrity.choices import Subcategory
from apps.integrity.models import BlockedAttempt
from apps.research.models import Candidate, ResearchNode, Run
from tests.support.mcp_client import EXPOS_MCP, ROOT, TRANSPORTS, as_agent, command_sections


def _error_code(result: types.CallToolResult) -> str:
    assert result.isError, result
    return result.structuredContent["error"]["code"]


def test_a_worker_token_lists_exactly_the_worker_tools_with_the_registry_schemas(served, world):
    transport, base = served
    listed = as_agent(transport, base, world.tokens["own"], lambda s: s.list_tools())
    tools = {t.name: t for t in listed.tools}
    registry = {t.name: t for t in tools_for_role("worker")}
    assert set(tools) == set(registry)
    assert "stop_loop" not in tools  # a Main tool
    for name, declared in registry.items():
        shown = tools[name]
        assert shown.description == declared.description
        extra = {IDEMPOTENCY_ARGUMENT} if declared.idempotent_create else set()
        extra |= {IF_MATCH_ARGUMENT} if declared.etag_node is not None else set()
        schema = json.loads(json.dumps(declared.input_schema))
        assert set(shown.inputSchema["properties"]) - set(schema["properties"]) == extra
        for argument in extra:
            shown.inputSchema["properties"].pop(argument)
        assert shown.inputSchema == schema


def test_calls_go_through_the_rest_path_with_idempotency_and_events(served, world):
    transport, base = served

    async def script(session: ClientSession) -> list[types.CallToolResult]:
        args = {"title": "mcp candidate", IDEMPOTENCY_ARGUMENT: f"mcp-{transport}"}
        return [
            await session.call_tool("public_check_quota", {}),
            await session.call_tool("worker_propose_candidate", args),
            await session.call_tool("worker_propose_candidate", args),
        ]

    quota, first, again = as_agent(transport, base, world.tokens["own"], script)
    assert not quota.isError
    assert quota.structuredContent["feedback_evals"]["used"] == 3
    assert json.loads(quota.content[0].text) == quota.structuredContent
    assert first.structuredContent["uuid"] == again.structuredContent["uuid"]
    assert again.meta == {"idempotent_replayed": True}
    assert Candidate.objects.filter(run=world.run, title="mcp candidate").count() == 1
    calls = Event.objects.filter(run=world.run, type="tool.called", tool="worker_propose_candidate")
    assert [e.arguments.get("replayed", False) for e in calls.order_by("seq")] == [False, True]


def test_a_forbidden_call_is_a_tool_error_with_the_api_code_and_is_recorded(served, world):
    transport, base = served
    result = as_agent(transport, base, world.tokens["own"], lambda s: s.call_tool("stop_loop", {"reason": "x"}))
    assert _error_code(result) == "forbidden_role"
    assert result.content[0].text.startswith("forbidden_role: stop_loop is for the main role")
    refused = Event.objects.filter(run=world.run, type="tool.called", tool="stop_loop").get()
    assert refused.actor == "worker_0001"
    assert refused.arguments["status"] == 403


def test_a_final_split_request_is_blocked_and_counted(served, world):
    transport, base = served
    before = BlockedAttempt.objects.filter(run=world.run).count()
    spec = {"kind": "eval_only", "claim": "peek", "eval": {"split": "final"}, IDEMPOTENCY_ARGUMENT: "peek-1"}
    result = as_agent(transport, base, world.tokens["own"], lambda s: s.call_tool("worker_submit", spec))
    assert _error_code(result) == "submission_refused"
    assert "split_sealed" in result.content[0].text  # the API's detail, for the model to read
    attempts = BlockedAttempt.objects.filter(run=world.run)
    assert attempts.count() == before + 1
    attempt = attempts.latest("pk")
    assert attempt.subcategory == Subcategory.TEST_SET_ACCESS
    assert attempt.request["code"] == "split_sealed"
    refused = Event.objects.filter(run=world.run, type="tool.called", tool="worker_submit").latest("seq")
    assert refused.arguments["idempotency_key"] == "peek-1"


def test_a_bad_token_is_refused_over_stdio(api):
    """Over HTTP the mount refuses it before the SDK (test_mcp_screening.py)."""

    async def script(session: ClientSession) -> McpError | None:
        try:
            await session.list_tools()
        except McpError as exc:
            return exc
        return None

    refused = as_agent("stdio", api.base, "not-a-token", script)
    assert refused is not None
    assert refused.error.message == "authentication_failed: Unknown agent token."


def test_the_http_mount_answers_401_without_a_bearer_token(asgi_url):
    response = httpx.post(asgi_url + MCP_PATH, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["error"]["code"] == "not_authenticated"


def test_the_stdio_server_needs_a_token():
    env = {k: v for k, v in os.environ.items() if k != "RSI_TOKEN"}
    done = subprocess.run(EXPOS_MCP, env=env, cwd=ROOT, capture_output=True, text=True, timeout=30, input="")
    assert done.returncode == 2
    assert "RSI_TOKEN" in done.stderr


def test_start_run_harness_prints_configs_whose_token_serves_both_transports(asgi_url, world):
    out = io.StringIO()
    call_command("start_run", "--harness", "--benchmark", str(world.run.benchmark.uuid), "--api-url", asgi_url,
                 "--task", "improve addition", stdout=out)  # fmt: skip
    sections = command_sections(out.getvalue())
    run = Run.objects.get(uuid=sections["head"].split()[1])
    assert run.agent_mode == "external"
    assert run.status == "running"
    worker = ResearchNode.objects.get(run=run, kind="worker")
    assert worker.task == "improve addition"
    claude = json.loads(sections["Claude Code: .mcp.json"])["mcpServers"]
    codex = tomllib.loads(sections["Codex: ~/.codex/config.toml"])["mcp_servers"]
    assert set(claude) == set(codex) == {"rsiweb"}  # no --harness-main: the Worker's seat only
    assert claude["rsiweb"]["type"] == "http"
    assert claude["rsiweb"]["url"] == asgi_url + MCP_PATH
    assert codex["rsiweb"]["command"] == "expos"
    assert codex["rsiweb"]["args"] == ["mcp"]
    token = codex["rsiweb"]["env"]["RSI_TOKEN"]
    assert claude["rsiweb"]["headers"] == {"Authorization": f"Bearer {token}"}
    assert codex["rsiweb"]["env"]["RSI_URL"] == asgi_url
    assert f"token for {worker.handle} (worker): {token}" in sections["head"]

    async def me(session: ClientSession) -> types.CallToolResult:
        return await session.call_tool("state_get_current_worker", {})

    for transport in TRANSPORTS:
        answer = as_agent(transport, codex["rsiweb"]["env"]["RSI_URL"], token, me)
        assert not answer.isError, answer.content[0].text
        assert answer.structuredContent["worker"]["handle"] == worker.handle
        assert answer.meta["etag"]
