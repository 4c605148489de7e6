"""The agent step runner: one step of one agent per Celery task, and the run supervisor's tick.

A step is one model turn (or one heuristic decision) and its tool calls (STYLE.md 22):

1. **claim** — ``agent_loop_claim`` moves the loop from ``scheduled`` to ``running`` for this
   process; a duplicate or stale message finds nothing to claim and is dropped;
2. **act** — the policy sees a :class:`LoopStepView` and calls tools through it. Each call (and each
   model turn) is written to the loop's ``journal`` as soon as it is answered, so a step re-run
   after a crash replays the answers it already has and re-sends only the call in flight, with the
   same Idempotency-Key ``<node uuid>:<step>:<call index>`` — the server answers it once;
3. **commit** — ``agent_loop_step_commit`` saves the new policy state and the cursor together and
   enqueues the next step on commit: at once, after a countdown (a Worker waiting for its jobs),
   or not at all (the Main Agent waits for a trigger; a finished agent is done).

The loop rows, their transitions and all scheduling are the research app's
(``apps.research.agent_loops``); this module is the process side that runs a step: it holds the
agent's token, talks to the REST API and the model, and records LLM usage. Agent logic (policies,
prompts, the LLM) only sees what the REST API returns to its role.

The run supervisor (apps.flows.supervisor.run_supervise) ticks on the same queue while a run is active: it
enforces budgets, restarts lost steps, creates loops for the nodes the Main Agent spawned,
reconciles the integrity checks, and ends the run with the final evaluation.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.utils import timezone

from apps.expos.auth import agent_token_issue
from apps.flows import runs
from apps.research import services as research
from apps.research import transcripts
from apps.research.agent_config import LoopConfig, llm_config, loop_config, prompt_text
from apps.research.agent_loops import (
    LostClaim,
    agent_loop_claim,
    agent_loop_close,
    agent_loop_heartbeat,
    agent_loop_journal_save,
    agent_loop_step_commit,
    agent_loop_step_release,
    agent_loops_sync,
    node_role,
    run_supervise_check,
)
from apps.research.choices import RUN_TERMINAL_STATES, AgentLoopStatus, AgentMode, NodeKind, NodeStatus, RunStatus
from apps.research.models import AgentLoop, ResearchNode, Run
from apps.research.selectors import run_llm_profile
from workers.agents.client import ApiUnavailable, ExposClient, ServerFault, TokenRejected, ToolResult
from workers.agents.llm import ChatLLM, LLMUnavailable
from workers.agents.policies import Outcome, policy_for
from workers.agents.policies.transcript import LLMTurn

logger = logging.getLogger(__name__)


def api_base_url() -> str:
    """Where agents reach the REST API (the web process): ``RSI_API_URL``."""
    return settings.RSI_API_URL


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


# --- what a policy sees ----------------------------------------------------------------------------


@dataclass
class LoopStepView:
    """The policy's window onto one step (policies.base.StepView), with every call journaled."""

    loop_id: int
    role: str
    handle: str
    node_uuid: str
    step: int
    briefing: dict[str, Any]
    state: dict[str, Any]
    inbox: list[dict[str, Any]]
    poll_seconds: float
    wait_seconds: float
    tokens_left: int
    _client: ExposClient
    _run: Run  # whom this step's LLM usage is recorded against
    _node: ResearchNode
    _journal: list[dict[str, Any]]
    _claim: str
    _llm: Any = None  # () -> ChatLLM, built lazily (heuristic runs never need it)
    # The LLM policy's role prompt (apps/research/prompts) and context window; empty for heuristics.
    prompt_template: str = ""
    context_tokens: int = 0
    _index: int = 0
    calls: list[ToolResult] = field(default_factory=list)
    model_turns: list[dict[str, Any]] = field(default_factory=list)

    def idempotency_key(self, index: int) -> str:
        return f"{self.node_uuid}:{self.step}:{index}"

    def definitions(self) -> list[dict[str, Any]]:
        return self._client.definitions()

    def tool_names(self) -> set[str]:
        return self._client.tool_names()

    def call(self, name: str, args: dict[str, Any] | None = None, *, if_match: str | None = None) -> ToolResult:
        """Call one tool; answered from the journal when this step already made this call."""
        args = args or {}
        index = self._next_index()
        entry = self._replay(index, kind="tool", request={"name": name, "args": args})
        if entry is not None and self._ended_attempt(index, entry):
            # A server fault that ended the last attempt (policies.heuristic raises on a 5xx) is
            # not an answer to replay: the call goes again, with the same Idempotency-Key.
            del self._journal[index:]
            entry = None
        if entry is not None:
            result = ToolResult.from_json(entry["result"])
        else:
            result = self._client.call(name, args, idempotency_key=self.idempotency_key(index), if_match=if_match)
            self._record(index, {"kind": "tool", "request": {"name": name, "args": args}, "result": result.as_json()})
        self.calls.append(result)
        return result

    def llm(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, segment: int = 0, summary: str = ""
    ) -> LLMTurn:
        """One model turn; journaled with its usage, which is recorded against the node and run."""
        index = self._next_index()
        entry = self._replay(index, kind="llm", request=None)
        if entry is not None:
            turn = LLMTurn.from_json(entry["result"])
        else:
            if self._llm is None:
                raise RuntimeError("this loop has no LLM configured")
            turn = self._llm().complete(messages, tools)
            self._record(index, {"kind": "llm", "request": None, "result": turn.as_json()}, usage=turn)
            self.tokens_left -= turn.total_tokens
        # Recorded in the transcript when the step ends, with the tool answers it got.
        self.model_turns.append({"index": index, "messages": [dict(m) for m in messages], "tools": tools,
                                 "turn": turn, "segment": segment, "summary": summary})  # fmt: skip
        return turn

    # --- the journal ------------------------------------------------------------------------------

    def _next_index(self) -> int:
        index = self._index
        self._index += 1
        return index

    def _replay(self, index: int, *, kind: str, request: Any) -> dict[str, Any] | None:
        if index >= len(self._journal):
            return None
        entry = self._journal[index]
        if entry.get("kind") != kind or (request is not None and entry.get("request") != request):
            # The policy took another path than the crashed attempt; the rest of the journal is moot.
            logger.warning("loop %s step %s: journal diverged at call %s; continuing live", self.loop_id,
                           self.step, index)  # fmt: skip
            del self._journal[index:]
            return None
        return entry

    def _ended_attempt(self, index: int, entry: dict[str, Any]) -> bool:
        return index == len(self._journal) - 1 and int(entry["result"].get("status", 0)) >= 500

    def _record(self, index: int, entry: dict[str, Any], usage: LLMTurn | None = None) -> None:
        self._journal.append(entry)
        # At once, with any LLM usage in the same transaction: a crash after this replays, never re-asks.
        with transaction.atomic():
            agent_loop_journal_save(loop_id=self.loop_id, claim=self._claim, journal=self._journal)
            if usage is not None:
                research.llm_usage_record(run=self._run, node=self._node, model=usage.model,
                                          prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                                          cost_usd=usage.cost_usd)  # fmt: skip


# --- tokens ----------------------------------------------------------------------------------------

_TOKENS: dict[int, str] = {}
_TOKENS_LOCK = threading.Lock()


def node_token(node: ResearchNode, *, fresh: bool = False) -> str:
    """A bearer token for ``node``, minted once per process and kept only in memory.

    The database stores only token digests, so a restarted worker cannot recover a token and
    simply mints a new one (recorded as ``token.issued``); tokens stop working when the run ends.
    """
    with _TOKENS_LOCK:
        if not fresh and node.pk in _TOKENS:
            return _TOKENS[node.pk]
        plaintext, _token = agent_token_issue(
            run=node.run, node=node, role=node_role(node), expires_at=timezone.now() + timedelta(days=7),
            actor="orchestrator",
        )  # fmt: skip
        _TOKENS[node.pk] = plaintext
        return plaintext


# --- one step --------------------------------------------------------------------------------------


class StepHeartbeat:
    """Beats for a running step from a thread of its own, as ``workers.runtime.RunningJob`` does for jobs.

    The supervisor re-runs a step whose beat is older than ``LoopConfig.stale_seconds``: this is
    how a pool child that died alone (SIGKILL from the OOM killer; its worker lives on and acks
    nothing) is noticed within a minute instead of at the end of the step's lease. A step shorter
    than one interval never beats (the claim counts as the first beat) and opens no connection.
    """

    def __init__(self, *, loop_id: int, claim: str, interval: float) -> None:
        self.loop_id, self.claim, self.interval = loop_id, claim, interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"step-heartbeat-{loop_id}", daemon=True)

    def __enter__(self) -> StepHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=30)

    def _beat(self) -> None:
        try:
            while not self._done.wait(self.interval):
                try:
                    if not agent_loop_heartbeat(loop_id=self.loop_id, claim=self.claim):
                        # Taken over; the step learns it at its next journal write (LostClaim).
                        logger.warning("loop %s: step no longer claimed by %s", self.loop_id, self.claim)
                        return
                except DatabaseError:
                    # One missed beat is not a death: the supervisor waits several intervals.
                    logger.warning("loop %s: step heartbeat failed", self.loop_id, exc_info=True)
                    close_old_connections()
        finally:
            connection.close()  # this thread's own connection (a no-op when it never beat)


def agent_step_run(*, loop_id: int, step: int | None = None) -> None:
    """Run one step of one loop: claim, act through the policy, commit, enqueue the next."""
    config = loop_config()
    loop = AgentLoop.objects.select_related("run", "node").filter(pk=loop_id).first()
    if loop is None:
        logger.warning("agent loop %s does not exist; message dropped", loop_id)
        return
    run = loop.run
    if run.status in RUN_TERMINAL_STATES:
        agent_loop_close(loop_id=loop.pk, status=AgentLoopStatus.DONE, reason=f"the run is {run.status}")
        return
    if run.status == RunStatus.PAUSED:
        return  # run_resume re-sends every scheduled step
    claim = worker_name()
    if not agent_loop_claim(loop_id=loop_id, step=step, claim=claim):
        return
    loop.refresh_from_db()
    run_supervise_check(run=run, config=config)
    node = loop.node
    if loop.stop_requested:
        agent_loop_close(loop_id=loop.pk, status=AgentLoopStatus.DONE, reason="stop requested", claim=claim)
        return
    if node.kind != NodeKind.MAIN and node.status != NodeStatus.ACTIVE:
        agent_loop_close(loop_id=loop.pk, status=AgentLoopStatus.DONE, reason=f"{node.handle} is {node.status}",
                         claim=claim)  # fmt: skip
        return
    if loop.step >= config.max_steps:
        agent_loop_close(loop_id=loop.pk, status=AgentLoopStatus.DONE, reason=f"step limit {config.max_steps} reached",
                         claim=claim)  # fmt: skip
        return
    run = runs.run_budget_enforce(run=run)
    try:
        with StepHeartbeat(loop_id=loop.pk, claim=claim, interval=config.heartbeat_seconds):
            outcome, consumed = _act(loop, run, claim, config)
    except LostClaim:
        logger.warning("loop %s step %s: claim lost to another worker; stopping", loop.pk, loop.step)
        return
    except (ApiUnavailable, LLMUnavailable, TokenRejected) as exc:
        # Transient: the web process or the model endpoint is away (a restart, a rate limit).
        agent_loop_step_release(loop_id=loop.pk, claim=claim, error=f"{type(exc).__name__}: {exc}", config=config,
                                transient=True)  # fmt: skip
        return
    except ServerFault as exc:
        # A 5xx the policy would not act on: the step is retried from its journal (counted: a
        # server bug must not be retried for ever).
        logger.error("loop %s (%s) step %s: %s", loop.pk, node.handle, loop.step, exc)
        agent_loop_step_release(loop_id=loop.pk, claim=claim, error=f"ServerFault: {exc}", config=config,
                                transient=False)  # fmt: skip
        return
    except Exception as exc:
        logger.exception("loop %s (%s) step %s failed", loop.pk, node.handle, loop.step)
        agent_loop_step_release(loop_id=loop.pk, claim=claim, error=f"{type(exc).__name__}: {exc}", config=config,
                                transient=False)  # fmt: skip
        return
    committed = agent_loop_step_commit(loop_id=loop.pk, claim=claim, state=outcome.state, next_step=outcome.next,
                                       wait_seconds=outcome.wait_seconds, note=outcome.note, consumed=consumed,
                                       config=config)  # fmt: skip
    if not committed:
        logger.warning("loop %s step %s: claim lost before commit; result dropped", loop.pk, loop.step)
    if node.kind == NodeKind.MAIN:
        # The Main Agent may have spawned Workers and Reviewers: give each its loop now.
        agent_loops_sync(run=Run.objects.get(pk=run.pk))


def _briefing(run: Run, node: ResearchNode) -> dict[str, Any]:
    """What the system tells an agent about its assignment (as a person would brief a colleague)."""
    benchmark = run.benchmark
    policy = run.policy or {}
    return {
        "run": run.name,
        "role": node_role(node),
        "handle": node.handle,
        "task": node.task,
        "target_capability": run.target_capability,
        "benchmark": {"name": benchmark.name, "task": benchmark.task, "description": benchmark.description},
        "budgets": {
            "wall_seconds": run.budget_wall_seconds,
            "accelerator_seconds": run.budget_accelerator_seconds,
            "reserved_final_seconds": run.reserved_final_seconds,
            "llm_tokens": run.budget_llm_tokens,
        },
        "max_parallel_workers": run.max_parallel_workers,
        "search_policy": run.search_policy,
        "policy": {k: v for k, v in policy.items() if k not in ("allowed_teachers",)},
    }


def step_view(loop: AgentLoop, run: Run, claim: str, config: LoopConfig, client: ExposClient) -> LoopStepView:
    """The view of ``loop``'s current step as its policy sees it (journal included, for replay)."""
    node = loop.node
    role = node_role(node)
    is_llm = loop.policy == AgentMode.LLM
    return LoopStepView(
        loop_id=loop.pk,
        role=role,
        handle=node.handle,
        node_uuid=str(node.uuid),
        step=loop.step,
        briefing=_briefing(run, node),
        state=dict(loop.state or {}),
        inbox=list(loop.inbox),
        poll_seconds=config.poll_seconds,
        wait_seconds=config.wait_seconds,
        tokens_left=max(0, run.budget_llm_tokens - run.used_llm_tokens),
        _client=client,
        _run=run,
        _node=node,
        _journal=list(loop.journal or []),
        _claim=claim,
        _llm=_llm_factory(role, run_llm_profile(run)) if is_llm else None,
        prompt_template=prompt_text(role) if is_llm else "",
        context_tokens=llm_config(role, run_llm_profile(run)).context_tokens if is_llm else 0,
    )


# The share of a step's lease its tool calls may spend retrying a briefly unavailable API: the
# rest is left for the step to finish, or to release itself, before the lease runs out.
RETRY_SHARE_OF_LEASE = 0.75


def _act(loop: AgentLoop, run: Run, claim: str, config: LoopConfig) -> tuple[Outcome, list[str]]:
    node = loop.node
    deadline = time.monotonic() + config.lease_seconds * RETRY_SHARE_OF_LEASE
    client = ExposClient(base_url=api_base_url(), token=node_token(node), role=node_role(node), deadline=deadline)
    try:
        view = step_view(loop, run, claim, config, client)
        try:
            outcome = policy_for(loop.policy, view.role).step(view)
        except TokenRejected:
            # This process's token may have been revoked: one fresh token, then the step is retried.
            client.close()
            client.token = node_token(node, fresh=True)
            view = step_view(AgentLoop.objects.select_related("node").get(pk=loop.pk), run, claim, config, client)
            outcome = policy_for(loop.policy, view.role).step(view)
        transcript_record_step(view, outcome, policy=loop.policy)
    finally:
        client.close()
    return outcome, [str(item.get("id")) for item in view.inbox]


# --- transcripts -----------------------------------------------------------------------------------


def transcript_record_step(view: LoopStepView, outcome: Outcome, *, policy: str) -> None:
    """Record the step's model turns (apps.research.transcripts), in OpenAI chat-message form.

    An LLM turn is its exact request, the assistant message and the tool messages the policy
    wrote back. A heuristic step is written the same way: its tool calls as one assistant message's
    ``tool_calls``, their answers as ``tool`` messages, after the opening messages of its role. A
    step re-run after a crash replays its journal and records nothing twice.
    """
    calls = [
        {"name": e["request"]["name"], "arguments": e["request"]["args"], "result": e["result"]}
        for e in view._journal
        if e.get("kind") == "tool"
    ]
    if view.model_turns:
        messages_after = list((outcome.state or {}).get("messages") or [])
        for number, item in enumerate(view.model_turns):
            turn: LLMTurn = item["turn"]
            start = len(item["messages"]) + 1
            answers = [m for m in messages_after[start:] if m.get("role") == "tool"] if number == len(
                view.model_turns) - 1 else []  # fmt: skip
            transcripts.turn_record(
                run=view._run, node=view._node, source="llm", step=view.step, index=item["index"],
                messages=item["messages"], tools=item["tools"], response=turn.assistant_message(),
                tool_messages=answers, calls=calls, inbox=view.inbox, segment=item["segment"],
                summary=item["summary"], model=turn.model, finish_reason=turn.finish_reason,
                prompt_tokens=turn.prompt_tokens, completion_tokens=turn.completion_tokens,
                latency_ms=turn.latency_ms, attempts=turn.attempts,
            )  # fmt: skip
        return
    if policy == AgentMode.LLM or not calls:
        return
    tool_calls, answers = [], []
    for number, call in enumerate(calls):
        call_id = f"call_{view.step}_{number}"
        tool_calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call["arguments"], ensure_ascii=False, default=str),
                },
            }
        )
        answers.append({"role": "tool", "tool_call_id": call_id,
                        "content": transcripts.tool_message_content(call["result"])})  # fmt: skip
    opening = [
        {"role": "system", "content": f"The deterministic heuristic {view.role} policy ({view.handle}); no LLM."},
        {"role": "user", "content": view.briefing.get("task") or "The run has started. Plan the research."},
    ]
    transcripts.turn_record(
        run=view._run, node=view._node, source="heuristic", step=view.step, index=0, messages=opening,
        tools=view.definitions(), tool_messages=answers,
        response={"role": "assistant", "content": outcome.note or "", "tool_calls": tool_calls},
        calls=calls, inbox=view.inbox, model="heuristic", finish_reason="tool_calls",
    )  # fmt: skip


def _llm_factory(role: str, profile: str) -> Any:
    def build() -> ChatLLM:
        return ChatLLM(llm_config(role, profile))

    return build


# --- the run supervisor ------------------------------------------------------------------------------
