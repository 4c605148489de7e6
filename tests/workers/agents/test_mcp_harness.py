"""A harness run on the real stack: ``start_run --harness`` and a scripted MCP client in the harness's seat.

The configuration the command prints is what the test uses: Claude Code's ``.mcp.json`` (streamable
HTTP at the stack's web process, ``manage.py serve`` under uvicorn, so the mount of rsiweb/asgi.py
serves it) and Codex's ``config.toml`` (``expos mcp`` on stdio, here as this checkout's module). The
client registers catalog data, trains and evaluates for real, waits, and finalizes.
"""

from __future__ import annotations

import io
import json
import time
import tomllib
from typing import Any

import anyio
import httpx
import pytest
from django.core.management import call_command
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from apps.experiments.models import Event, Experiment
from apps.expos.registry import tools_for_role
from apps.flows.runs import run_stop
from apps.research.choices import NodeStatus, RunStatus
from apps.research.models import ResearchNode, Run
from tests.support.mcp_client import EXPOS_MCP, ROOT, command_sections
from tests.workers.agents.stack import wait_for

pytestmark = [pytest.mark.slow]

TRAIN_TIMEOUT = 600


def _data(result: Any) -> dict[str, Any]:
    assert not result.isError, result.content[0].text
    return result.structuredContent


async def _worker_script(session: ClientSession) -> dict[str, Any]:
    """What a harness would do: look, register data, submit, wait, finalize."""
    names = {t.name for t in (await session.list_tools()).tools}
    me = await session.call_tool("state_get_current_worker", {})
    assert not me.isError
    added = _data(await session.call_tool("worker_add_data", {"catalog": "arithmetic-clean", "note": "via MCP"}))
    handle = added["entry"]["handle"]
    spec = {
        "claim": "a three-step SFT through MCP",
        "train": {"recipe": "sft", "datasets": [handle], "max_steps": 3, "hyperparameters": {"batch_size": 8}},
        "idempotency_key": "mcp-harness-1",
    }
    experiment = _data(await session.call_tool("worker_submit", spec))["experiment"]
    deadline = time.monotonic() + TRAIN_TIMEOUT
    while True:
        current = await session.call_tool("state_get_current_worker", {})
        briefs = {e["handle"]: e for e in _data(current)["experiments"]}
        if briefs[experiment]["status"] not in ("held", "queued", "running"):
            break
        assert time.monotonic() < deadline, f"{experiment} still {briefs[experiment]['status']}"
        await anyio.sleep(2)
    etag = current.meta["etag"]
    summary = f"Trained a three-step SFT on arithmetic-clean: {experiment} {briefs[experiment]['status']}."
    done = _data(await session.call_tool("worker_finalize", {"summary": summary, "experiments": [experiment],
                                                              "if_match": etag}))  # fmt: skip
    return {"names": names, "experiment": experiment, "finalized": done}


@pytest.mark.django_db(transaction=True)
def test_a_harness_run_driven_over_mcp_ends_with_an_accepted_experiment(installed):
    stack = installed
    out = io.StringIO()
    call_command("start_run", "--harness", "--harness-main", "--benchmark", "minibench/arithmetic",
                 "--name", "agents: mcp harness", "--api-url", stack.url, "--wall-seconds", "1800",
                 "--accelerator-seconds", "1200", stdout=out)  # fmt: skip
    sections = command_sections(out.getvalue())
    run = Run.objects.get(uuid=sections["head"].split()[1])
    worker = ResearchNode.objects.get(run=run, kind="worker")
    assert run.agent_mode == "external"
    assert run.status == RunStatus.RUNNING
    assert worker.status == NodeStatus.ACTIVE
    claude = json.loads(sections["Claude Code: .mcp.json"])["mcpServers"]
    codex = tomllib.loads(sections["Codex: ~/.codex/config.toml"])["mcp_servers"]
    assert set(claude) == set(codex) == {"rsiweb", "rsiweb-main"}
    assert claude["rsiweb"]["url"] == stack.url + "/api/v1/mcp"
    assert codex["rsiweb"]["command"] == "expos"
    assert codex["rsiweb"]["args"] == ["mcp"]
    token = codex["rsiweb"]["env"]["RSI_TOKEN"]
    assert claude["rsiweb"]["headers"]["Authorization"] == f"Bearer {token}"
    assert f"token for {worker.handle} (worker): {token}" in sections["head"]

    async def over_http(server: dict[str, Any], script: Any) -> Any:
        async with (
            httpx.AsyncClient(headers=server["headers"], timeout=60) as http,
            streamable_http_client(server["url"], http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await script(session)

    async def over_stdio(server: dict[str, Any], script: Any) -> Any:
        params = StdioServerParameters(command=EXPOS_MCP[0], args=EXPOS_MCP[1:], env=server["env"], cwd=ROOT)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await script(session)

    async def main_tools(session: ClientSession) -> set[str]:
        return {t.name for t in (await session.list_tools()).tools}

    # Codex's stdio server works with the Main Agent's token; the Worker's seat is played over HTTP.
    assert anyio.run(over_stdio, codex["rsiweb-main"], main_tools) == {t.name for t in tools_for_role("main")}
    played = anyio.run(over_http, claude["rsiweb"], _worker_script)
    try:
        assert played["names"] == {t.name for t in tools_for_role("worker")}
        assert played["finalized"]["status"] == "finalized"
        experiment = Experiment.objects.get(run=run, handle=played["experiment"])
        assert experiment.status == "succeeded"
        # The integrity post-check runs after the job; the harness's experiment is accepted.
        wait_for(lambda: Experiment.objects.get(pk=experiment.pk).integrity_status != "pending",
                 timeout=120, what="the integrity post-check", stack=stack)  # fmt: skip
        assert Experiment.objects.get(pk=experiment.pk).integrity_status == "accepted"
        # Everything the harness did is on record as the Worker's tool calls.
        calls = Event.objects.filter(run=run, type="tool.called", actor=worker.handle)
        assert {"worker_add_data", "worker_submit", "worker_finalize"} <= set(calls.values_list("tool", flat=True))
    finally:
        run_stop(run=run, actor="test", reason="test over", final_eval=False)
