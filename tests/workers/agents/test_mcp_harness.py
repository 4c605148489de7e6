"""A whole harness run on the real stack, driven through the MCP SDK's client alone (issue 31, item 7).

``start_run --harness --harness-main --parallel 2`` prints the configuration the test uses: Codex's
``config.toml`` (``expos mcp`` on stdio, here as this checkout's module) for the Main Agent and
Claude Code's ``.mcp.json`` (streamable HTTP at the stack's web process) for the Workers. The Main
Agent follows the CLAUDE.md of docs/harnesses.md: it creates a second Worker (its token comes in the
answer), runs both Workers at once, each registering rows it wrote itself (``worker_add_data`` with
``content``), training three steps on them and finalizing; it asks for a Review, which our own
Reviewer loop plays, reads the report and stops the run. The run finishes (final evaluation
included), and ``export_trajectories`` exports every role: the Main Agent's, both Workers' and the
Reviewer's turns (the Reviewer's at the Main Agent's visibility: sealed evidence withheld).
"""

from __future__ import annotations

import io
import json
import re
import time
import tomllib
from typing import Any

import anyio
import pytest
from django.core.management import call_command
from mcp import ClientSession

from apps.datapool.models import DataEntry
from apps.datapool.services import data_load_rows
from apps.experiments.models import Event, Experiment
from apps.expos.registry import load_all, tools_for_role
from apps.flows.runs import run_stop
from apps.research.choices import RUN_TERMINAL_STATES, NodeStatus, RunStatus
from apps.research.models import ResearchNode, Run, TranscriptTurn
from apps.research.transcripts import node_turns
from tests.apps.expos.tools.test_data_upload import honest_rows, jsonl, upload_args
from tests.support.mcp_client import ROOT, command_sections, mcp_session
from tests.workers.agents.stack import wait_for

pytestmark = [pytest.mark.slow]

TRAIN_TIMEOUT = 600
GUIDE = ROOT / "docs" / "harnesses.md"


def _data(result: Any) -> dict[str, Any]:
    assert not result.isError, result.content[0].text
    return result.structuredContent


async def _worker(session: ClientSession, seed: int) -> dict[str, Any]:
    """A Worker as CLAUDE.md tells it: look, register its own rows, train, wait, finalize."""
    names = {t.name for t in (await session.list_tools()).tools}
    me = _data(await session.call_tool("state_get_current_worker", {}))["worker"]["handle"]
    # New three-digit sums written by the harness (the sealed items are two-digit).
    upload = upload_args(jsonl(honest_rows(seed=seed, n=16)), generator=f"gen_sums.py --seed {seed}")
    added = _data(await session.call_tool("worker_add_data", {
        **upload, "note": "three-digit sums, written by the harness", "idempotency_key": f"rows-{me}"}))  # fmt: skip
    spec = {
        "claim": "three SFT steps on our own three-digit sums",
        "train": {"recipe": "sft", "datasets": [added["entry"]["handle"]], "max_steps": 3,
                  "hyperparameters": {"batch_size": 8}},
        "idempotency_key": f"sft-{me}",
    }  # fmt: skip
    experiment = _data(await session.call_tool("worker_submit", spec))["experiment"]
    deadline = time.monotonic() + TRAIN_TIMEOUT
    while True:
        current = await session.call_tool("state_get_current_worker", {})
        briefs = {e["handle"]: e for e in _data(current)["experiments"]}
        if briefs[experiment]["status"] not in ("held", "queued", "running"):
            break
        assert time.monotonic() < deadline, f"{experiment} still {briefs[experiment]['status']}"
        await anyio.sleep(2)
    summary = f"{experiment} ({briefs[experiment]['status']}): three SFT steps on 16 rows of our own sums."
    done = _data(await session.call_tool("worker_finalize", {"summary": summary, "experiments": [experiment],
                                                              "if_match": current.meta["etag"]}))  # fmt: skip
    return {"names": names, "handle": me, "experiment": experiment, "status": done["status"], "source": added}


async def _main(main: ClientSession, url: str, first: str) -> dict[str, Any]:
    """The Main Agent as CLAUDE.md tells it: a second branch, both Workers at once, a review, stop."""
    names = {t.name for t in (await main.list_tools()).tools}
    policy = _data(await main.call_tool("run_result_policy", {}))
    assert policy["settings"]["parallel_workers"] == 2
    ask = {"task": "SFT on three-digit sums we write ourselves", "idempotency_key": "w-sums"}
    created = _data(await main.call_tool("state_add_new_worker", ask))
    replay = _data(await main.call_tool("state_add_new_worker", ask))
    assert (replay["replayed"], replay["handle"], "token" in replay) == (True, created["handle"], False)

    async def play(token: str, seed: int, out: dict[str, Any]) -> None:
        async with mcp_session("http", url, token) as session:
            out[token] = await _worker(session, seed)

    played: dict[str, Any] = {}
    async with anyio.create_task_group() as group:  # the two Workers at once, each as itself
        group.start_soon(play, first, 1, played)
        group.start_soon(play, created["token"], 2, played)
    workers = sorted(played.values(), key=lambda w: w["handle"])
    review = _data(await main.call_tool("state_add_new_reviewer", {
        "question": "Do both results hold up, and are they comparable?",
        "scope": [w["handle"] for w in workers], "idempotency_key": "review-1"}))  # fmt: skip
    assert "token" not in review  # our own Reviewer loop plays it
    reviewer = review["reviewer"]["handle"]
    deadline = time.monotonic() + 300
    while True:
        state = _data(await main.call_tool("state_get_current_main", {}))
        status = next(r["status"] for r in state["reviewers"] if r["handle"] == reviewer)
        if status != "active":
            break
        assert time.monotonic() < deadline, f"{reviewer} still active"
        await anyio.sleep(2)
    report = _data(await main.call_tool("inspect_reviewer_report", {"reviewer": reviewer}))
    stopped = _data(await main.call_tool("stop_loop", {"reason": "two branches done and reviewed"}))
    return {"names": names, "workers": workers, "reviewer": reviewer, "report": report, "stopped": stopped}


@pytest.mark.django_db(transaction=True)
def test_a_harness_run_driven_over_mcp_finishes_and_exports_every_role(installed):
    stack = installed
    out = io.StringIO()
    call_command("start_run", "--harness", "--harness-main", "--parallel", "2", "--benchmark", "minibench/arithmetic",
                 "--name", "agents: mcp harness", "--api-url", stack.url, "--wall-seconds", "1800",
                 "--accelerator-seconds", "1200", stdout=out)  # fmt: skip
    sections = command_sections(out.getvalue())
    run = Run.objects.get(uuid=sections["head"].split()[1])
    assert (run.agent_mode, run.status) == ("external", RunStatus.RUNNING)
    claude = json.loads(sections["Claude Code: .mcp.json"])["mcpServers"]
    codex = tomllib.loads(sections["Codex: ~/.codex/config.toml"])["mcp_servers"]
    assert set(claude) == set(codex) == {"rsiweb", "rsiweb-main"}
    assert claude["rsiweb"]["url"] == stack.url + "/api/v1/mcp"
    assert (codex["rsiweb"]["command"], codex["rsiweb"]["args"]) == ("expos", ["mcp"])
    first = codex["rsiweb"]["env"]["RSI_TOKEN"]
    assert claude["rsiweb"]["headers"]["Authorization"] == f"Bearer {first}"

    async def scenario() -> dict[str, Any]:
        # The Main Agent over stdio (Codex's entry), the Workers over HTTP (Claude Code's).
        async with mcp_session("stdio", stack.url, codex["rsiweb-main"]["env"]["RSI_TOKEN"]) as main:
            return await _main(main, stack.url, first)

    try:
        played = anyio.run(scenario)
        assert played["names"] == {t.name for t in tools_for_role("main")}
        for worker in played["workers"]:
            assert worker["names"] == {t.name for t in tools_for_role("worker")}
            assert worker["status"] == "finalized"
            assert worker["source"]["entry"]["source_kind"] == "agent"
            assert Experiment.objects.get(run=run, handle=worker["experiment"]).status == "succeeded"
        assert [w["handle"] for w in played["workers"]] == ["worker_0001", "worker_0002"]
        assert played["report"]["status"] == "finalized"
        assert played["report"]["reports"]
        run = wait_for(lambda: Run.objects.filter(pk=run.pk, status__in=RUN_TERMINAL_STATES).first(),
                       timeout=600, what="the run's end (final evaluation)", stack=stack)  # fmt: skip
        assert run.status == RunStatus.FINISHED
        # No nomination: the documented rule chose among the Workers' accepted experiments.
        started = Event.objects.get(run=run, type="run.final_eval_started").arguments
        assert started["chosen_by"]["by"] == "rule"
        assert started["best"] in {w["experiment"] for w in played["workers"]}
    finally:
        if Run.objects.get(pk=run.pk).status not in RUN_TERMINAL_STATES:
            run_stop(run=run, actor="test", reason="test over", final_eval=False)

    # Every call of every role is a turn: the harness's Main and Workers call by call (the replay
    # marked), our Reviewer by its loop's steps.
    nodes = {n.handle: n for n in ResearchNode.objects.filter(run=run)}
    for handle in ("main", "worker_0001", "worker_0002"):
        calls = Event.objects.filter(run=run, type="tool.called", actor=handle).count()
        turns = TranscriptTurn.objects.filter(node=nodes[handle])
        assert calls > 0
        assert turns.count() == calls, (handle, calls, turns.count())
        assert set(turns.values_list("source", flat=True)) == {"harness"}
    main_calls = [(t["calls"][0]["name"], t["calls"][0].get("replayed", False)) for t in node_turns(nodes["main"])]
    assert [c for c in main_calls if c[0] == "state_add_new_worker"] == [
        ("state_add_new_worker", False),
        ("state_add_new_worker", True),
    ]
    assert nodes[played["reviewer"]].status == NodeStatus.FINALIZED
    assert TranscriptTurn.objects.filter(node=nodes[played["reviewer"]], source="heuristic").exists()

    exported = io.StringIO()
    call_command("export_trajectories", "--run", str(run.uuid), "--filters", "none", "--name", "harness run",
                 stdout=exported)  # fmt: skip
    handle = re.search(r"registered (\S+) ", exported.getvalue()).group(1)  # type: ignore[union-attr]
    rows = data_load_rows(entry=DataEntry.objects.get(handle=handle))
    by_node = {(r["metadata"]["node"], r["metadata"]["role"]) for r in rows}
    assert by_node == {("main", "main"), ("worker_0001", "worker"), ("worker_0002", "worker"),
                       (played["reviewer"], "reviewer")}  # fmt: skip
    # One row per trained assistant message (TRL's prompt-completion form): the Main's calls are
    # its rows' completions, the replay among them.
    called = [c["function"]["name"] for r in rows if r["metadata"]["node"] == "main"
              for m in r["completion"] for c in m.get("tool_calls", [])]  # fmt: skip
    assert called.count("state_add_new_worker") == 2  # the replay is in the trajectory too
    reviewed = re.search(r"(\d+) of them Reviewers'", exported.getvalue())
    assert reviewed is not None, exported.getvalue()
    assert int(reviewed.group(1)) >= 1


def test_the_claude_md_of_the_harness_guide_names_only_tools_that_exist():
    """docs/harnesses.md's CLAUDE.md / AGENTS.md is what the test above plays; its tool names are real."""
    text = GUIDE.read_text(encoding="utf-8")
    block = text.split("<!-- CLAUDE.md -->", 2)[1]
    # Tools named bare (the Main's MCP tools) or as CLI commands (the Workers' brief).
    named = set(re.findall(r"`([a-z]+(?:_[a-z]+)+)`", block)) | set(re.findall(r"`expos ([a-z]+(?:_[a-z]+)+)", block))
    tools = load_all()
    codes = {code for t in tools.values() for code in t.errors}  # error codes look like tool names
    prefixes = {"state", "worker", "main", "reviewer", "run", "stop", "inspect", "job", "training", "compare", "public"}
    mentioned = {n for n in named - codes if n.split("_")[0] in prefixes}
    assert mentioned, "the guide's CLAUDE.md names no tool"
    assert mentioned <= set(tools), sorted(mentioned - set(tools))
    for used in ("state_add_new_worker", "worker_add_data", "worker_submit", "worker_finalize",
                 "state_add_new_reviewer", "inspect_reviewer_report", "stop_loop", "run_result_policy"):  # fmt: skip
        assert used in mentioned, used
