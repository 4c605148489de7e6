"""A harness run: an external agent harness (Claude Code, Codex) plays a run's Worker through MCP.

The paper's "framework + ExpOS" setting. The run is an ``external`` run (no agent loop of ours
drives its Main Agent or Workers); at start it gets its first Worker node, and optionally the harness
plays the Main Agent too, creating more Workers (up to the run's ``--parallel``) whose tokens come
back in the creating call's answer, and Reviewers: played by our own Reviewer loop, or with
``--harness-reviewers`` by the harness (their tokens come back as the Workers' do). The operator
gets one token per node and ready-to-paste MCP configuration for each harness (``manage.py
start_run --harness``; docs/harnesses.md). Everything the harness does goes through
the ExpOS tools, so it is recorded like any agent's calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from apps.core.errors import ApplicationError
from apps.expos.auth import agent_token_issue
from apps.expos.mcp_server import MCP_PATH
from apps.expos.registry import ToolContext
from apps.flows.runs import run_start
from apps.research.agent_loops import agent_loop_ensure
from apps.research.choices import AgentMode, NodeKind
from apps.research.models import ResearchNode, Run
from apps.research.selectors import harness_plays
from apps.research.services import run_create, worker_add

SERVER_NAME = "rsiweb"
TOKEN_DAYS = 7


@dataclass(frozen=True)
class HarnessSeat:
    """One node the harness plays, with its token (shown once; only its digest is stored)."""

    node: ResearchNode
    token: str

    @property
    def server_name(self) -> str:
        return SERVER_NAME if self.node.kind == NodeKind.WORKER else f"{SERVER_NAME}-{self.node.handle}"


@dataclass(frozen=True)
class HarnessRun:
    run: Run
    seats: list[HarnessSeat]


def harness_run_start(
    *,
    benchmark: Any,
    base_checkpoint: Any,
    name: str,
    task: str,
    wall_seconds: int,
    accelerator_seconds: int,
    reserved_final_seconds: int,
    plays_main: bool = False,
    plays_reviewers: bool = False,
    parallel: int = 2,
    seed: int = 0,
    gate: bool = False,
    reviewer: bool = True,
    actor: str = "cli",
) -> HarnessRun:
    """Create and start an external run with one Worker; tokens for the Worker (and the Main Agent).

    The run's settings are those of our own loops (``run_launch``): ``parallel`` Workers at most at
    once (the Main Agent adds the others, each with its token in the answer), the training gate,
    Reviewers or not, and the run's ``seed`` in its policy, where every agent reads it. The Reviewers
    the Main Agent requests are played by our own Reviewer loop unless ``plays_reviewers``.
    """
    if parallel < 1:
        raise ApplicationError("invalid_parallel", f"parallel is at least 1, got {parallel}.")
    if plays_reviewers and not (plays_main and reviewer):
        raise ApplicationError(
            "invalid_harness_reviewers",
            "The harness plays Reviewers only when it plays the Main Agent (who requests them) and the run has "
            "Reviewers.",
        )
    run = run_create(
        name=name or f"{benchmark.name} harness",
        benchmark=benchmark,
        base_checkpoint=base_checkpoint,
        target_capability=benchmark.description or benchmark.task,
        budget_wall_seconds=wall_seconds,
        budget_accelerator_seconds=accelerator_seconds,
        budget_llm_tokens=0,
        max_parallel_workers=parallel,
        reserved_final_seconds=reserved_final_seconds,
        agent_mode=AgentMode.EXTERNAL,
        policy={
            "harness": {"plays_main": plays_main, "plays_reviewers": plays_reviewers},
            "training_gate": gate,
            "reviewers": reviewer,
            "serial_workers": parallel == 1,
            "seed": seed,
        },
    )
    run = run_start(run=run, actor=actor)
    task = task or f"Improve the target capability: {run.target_capability}"
    worker = worker_add(run=run, task=task, predecessors=[], actor=actor)
    nodes = [worker, ResearchNode.objects.get(run=run, kind=NodeKind.MAIN)] if plays_main else [worker]
    expires = timezone.now() + timedelta(days=TOKEN_DAYS)
    seats = [
        HarnessSeat(
            node=node, token=agent_token_issue(run=run, node=node, role=node.kind, expires_at=expires, actor=actor)[0]
        )
        for node in nodes
    ]
    return HarnessRun(run=run, seats=seats)


def harness_seat_token(*, run: Run, node: ResearchNode, actor: str) -> str | None:
    """A token for a Worker or Reviewer the harness's Main Agent just created, or None.

    In an external run no loop of ours plays a node the harness's Main Agent creates, so the
    harness must: the token is minted now, in the creating call's transaction, and shown once in
    its answer (only the digest is stored; an idempotent replay does not show it again). Scoped
    as any token: its run, its node, the node's role, and :data:`TOKEN_DAYS`.
    """
    if run.agent_mode != AgentMode.EXTERNAL or node.kind == NodeKind.MAIN or not harness_plays(run, node):
        return None
    expires = timezone.now() + timedelta(days=TOKEN_DAYS)
    return agent_token_issue(run=run, node=node, role=node.kind, expires_at=expires, actor=actor)[0]


def claude_code_config(*, api_url: str, seats: list[HarnessSeat]) -> dict[str, Any]:
    """``.mcp.json`` for Claude Code: the streamable-HTTP server, the token as a bearer header."""
    url = api_url.rstrip("/") + MCP_PATH
    return {
        "mcpServers": {
            seat.server_name: {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {seat.token}"}}
            for seat in seats
        }
    }


def codex_config(*, api_url: str, seats: list[HarnessSeat]) -> str:
    """``~/.codex/config.toml`` for Codex: ``expos mcp`` on stdio, reading RSI_URL and RSI_TOKEN."""
    blocks = []
    for seat in seats:
        # JSON strings are valid TOML basic strings for everything a URL or token holds.
        env = f"{{ RSI_URL = {json.dumps(api_url.rstrip('/'))}, RSI_TOKEN = {json.dumps(seat.token)} }}"
        blocks.append(f'[mcp_servers.{seat.server_name}]\ncommand = "expos"\nargs = ["mcp"]\nenv = {env}\n')
    return "\n".join(blocks)


def seat_token_show(ctx: ToolContext, node: ResearchNode) -> None:
    """Seat a node the harness's Main Agent just created in an external run.

    The harness's own node gets its token in the creating call's answer (ToolContext.shown_once);
    a Reviewer the harness does not play gets our Reviewer loop now, in the call's transaction (its
    first step is sent on commit), rather than at the supervisor's next tick.
    """
    if ctx.run.agent_mode != AgentMode.EXTERNAL:
        return
    if node.kind == NodeKind.REVIEWER and not harness_plays(ctx.run, node):
        agent_loop_ensure(node=node, policy=AgentMode.HEURISTIC)
        return
    token = harness_seat_token(run=ctx.run, node=node, actor=ctx.actor)
    if token is not None:
        ctx.shown_once["token"] = token
