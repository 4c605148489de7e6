"""The agent loop machinery: one step per Celery task, its cursor and journal on ``AgentLoop``.

A step is one model turn (or one heuristic decision) and its tool calls (STYLE.md 22):

1. **claim** — a conditional UPDATE moves the loop from ``scheduled`` to ``running`` for this
   process; a duplicate or stale message finds nothing to claim and is dropped;
2. **act** — the policy sees a :class:`StepView` and calls tools through it. Each call (and each
   model turn) is written to the loop's ``journal`` as soon as it is answered, so a step re-run
   after a crash replays the answers it already has and re-sends only the call in flight, with the
   same Idempotency-Key ``<node uuid>:<step>:<call index>`` — the server answers it once;
3. **commit** — the new policy state and the cursor (``step + 1``) are saved together, and the
   next step is enqueued on commit: at once, after a countdown (a Worker waiting for its jobs), or
   not at all (the Main Agent waits for a trigger; a finished agent is done).

Agent logic (policies, prompts, the LLM) only sees what the REST API returns to its role; this
module is the system side that schedules it, holds its token, and records its LLM usage.

The run supervisor (:func:`run_supervise`) ticks on the same queue while a run is active: it
enforces budgets, restarts lost steps, creates loops for the nodes the Main Agent spawned, and ends
the run with the final evaluation. Ticks are numbered so that a duplicated tick runs once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.research.choices import (
    AGENT_LOOP_ACTIVE_STATES,
    RUN_TERMINAL_STATES,
    AgentLoopStatus,
    AgentMode,
    NodeKind,
    NodeStatus,
    RunStatus,
)
from apps.research.models import AgentLoop, ResearchNode, Run
from rsiweb import env
from workers.agents.client import ApiUnavailable, ExposClient, TokenRejected, ToolResult
from workers.agents.llm import LLMTurn, LLMUnavailable
from workers.agents.policies import Outcome

logger = logging.getLogger(__name__)

STEP_TASK = "workers.agents.agent_step_task"
SUPERVISE_TASK = "workers.agents.run_supervise_task"
QUEUE = "agents"


@dataclass(frozen=True)
class LoopConfig:
    """Timing of the loops, from the environment (tests shorten it)."""

    poll_seconds: float  # a short pause before looking again (a step that made no progress)
    wait_seconds: float  # a Worker waiting for its jobs re-checks after this long at the latest
    lease_seconds: float  # a step running longer than this is presumed dead and re-run
    lost_after_seconds: float  # a scheduled step nobody claimed for this long is re-sent
    supervise_seconds: float  # the run supervisor's tick
    max_steps: int  # a loop that reaches it ends: no agent runs forever
    max_failures: int  # consecutive failed attempts of one step before the loop fails
    final_grace_seconds: float  # how long a stopping run waits for summaries and post-checks
    quiet_seconds: float  # a running run with nothing active for this long is stopped


def loop_config() -> LoopConfig:
    return LoopConfig(
        poll_seconds=env.number("RSI_AGENT_POLL_SECONDS", 3.0),
        wait_seconds=env.number("RSI_AGENT_WAIT_SECONDS", 60.0),
        lease_seconds=env.number("RSI_AGENT_STEP_LEASE_SECONDS", 600.0),
        lost_after_seconds=env.number("RSI_AGENT_LOST_AFTER_SECONDS", 60.0),
        supervise_seconds=env.number("RSI_RUN_SUPERVISE_SECONDS", 5.0),
        max_steps=int(env.number("RSI_AGENT_MAX_STEPS", 5000)),
        max_failures=int(env.number("RSI_AGENT_MAX_FAILURES", 5)),
        final_grace_seconds=env.number("RSI_FINAL_GRACE_SECONDS", 180.0),
        quiet_seconds=env.number("RSI_RUN_QUIET_SECONDS", 120.0),
    )


def api_base_url() -> str:
    """Where agents reach the REST API (the web process): ``RSI_API_URL``."""
    from django.conf import settings

    return settings.RSI_API_URL


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


# --- what a policy sees ----------------------------------------------------------------------------


class LostClaim(RuntimeError):
    """Another process took this step over (the lease ran out); this one must stop at once."""


class JournalDiverged(RuntimeError):
    """A re-run step asked something else than the journal recorded (a non-deterministic policy)."""


@dataclass
class StepView:
    """The policy's window onto one step: its briefing, memory, triggers, and the journaled tools."""

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
    _journal: list[dict[str, Any]]
    _claim: str
    _llm: Any = None  # () -> ChatLLM, built lazily (heuristic runs never need it)
    _index: int = 0
    calls: list[ToolResult] = field(default_factory=list)

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
        if entry is not None:
            result = ToolResult.from_json(entry["result"])
        else:
            result = self._client.call(name, args, idempotency_key=self.idempotency_key(index), if_match=if_match)
            self._record(index, {"kind": "tool", "request": {"name": name, "args": args}, "result": result.as_json()})
        self.calls.append(result)
        return result

    def llm(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMTurn:
        """One model turn; journaled with its usage, which is recorded against the node and run."""
        index = self._next_index()
        entry = self._replay(index, kind="llm", request=None)
        if entry is not None:
            return LLMTurn.from_json(entry["result"])
        if self._llm is None:
            raise RuntimeError("this loop has no LLM configured")
        turn: LLMTurn = self._llm().complete(messages, tools)
        self._record(index, {"kind": "llm", "request": None, "result": turn.as_json()}, usage=turn)
        self.tokens_left -= turn.total_tokens
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

    def _record(self, index: int, entry: dict[str, Any], usage: LLMTurn | None = None) -> None:
        self._journal.append(entry)
        _journal_save(self.loop_id, self._claim, self._journal, usage=usage)


def _journal_save(loop_id: int, claim: str, journal: list[dict[str, Any]], usage: LLMTurn | None) -> None:
    """Persist the journal (and any LLM usage) at once: a crash after this replays, never re-asks."""
    from apps.research.services import llm_usage_record

    with transaction.atomic():
        # Conditional on the claim: a step whose lease was taken over must not write anything more.
        saved = AgentLoop.objects.filter(pk=loop_id, status=AgentLoopStatus.RUNNING, claimed_by=claim).update(
            journal=journal, updated_at=timezone.now()
        )
        if saved != 1:
            raise LostClaim(f"loop {loop_id} is no longer claimed by {claim}")
        if usage is not None:
            loop = AgentLoop.objects.select_related("run", "node").get(pk=loop_id)
            llm_usage_record(run=loop.run, node=loop.node, model=usage.model, prompt_tokens=usage.prompt_tokens,
                             completion_tokens=usage.completion_tokens, cost_usd=usage.cost_usd)  # fmt: skip


# --- tokens ----------------------------------------------------------------------------------------

_TOKENS: dict[int, str] = {}
_TOKENS_LOCK = threading.Lock()


def _role(node: ResearchNode) -> str:
    return {NodeKind.MAIN: "main", NodeKind.WORKER: "worker", NodeKind.REVIEWER: "reviewer"}[NodeKind(node.kind)]


def node_token(node: ResearchNode, *, fresh: bool = False) -> str:
    """A bearer token for ``node``, minted once per process and kept only in memory.

    The database stores only token digests, so a restarted worker cannot recover a token and
    simply mints a new one (recorded as ``token.issued``); tokens stop working when the run ends.
    """
    from apps.expos.auth import agent_token_issue

    with _TOKENS_LOCK:
        if not fresh and node.pk in _TOKENS:
            return _TOKENS[node.pk]
        plaintext, _token = agent_token_issue(
            run=node.run, node=node, role=_role(node), expires_at=timezone.now() + timedelta(days=7),
            actor="orchestrator",
        )  # fmt: skip
        _TOKENS[node.pk] = plaintext
        return plaintext


# --- scheduling ------------------------------------------------------------------------------------


def _send_step(loop_id: int, step: int, countdown: float = 0.0) -> None:
    from rsiweb.celery import app

    app.send_task(STEP_TASK, kwargs={"loop_id": loop_id, "step": step}, queue=QUEUE,
                  countdown=max(0.0, countdown) or None)  # fmt: skip


def _send_step_on_commit(loop_id: int, step: int, countdown: float = 0.0) -> None:
    # After commit: a worker that got the message before the row is visible would find nothing to claim.
    transaction.on_commit(lambda: _send_step(loop_id, step, countdown))


def _send_tick(run_id: int, tick: int, countdown: float = 0.0) -> None:
    from rsiweb.celery import app

    app.send_task(SUPERVISE_TASK, kwargs={"run_id": run_id, "tick": tick}, queue=QUEUE,
                  countdown=max(0.0, countdown) or None)  # fmt: skip


def agent_loop_ensure(*, node: ResearchNode, policy: str) -> AgentLoop:
    """The loop of ``node``, created (and its first step enqueued) if it has none. Idempotent."""
    existing = AgentLoop.objects.filter(node=node).first()
    if existing is not None:
        return existing
    with transaction.atomic():
        # The node row lock makes check-then-create atomic; the one-to-one is the backstop.
        ResearchNode.objects.select_for_update().get(pk=node.pk)
        existing = AgentLoop.objects.filter(node=node).first()
        if existing is not None:
            return existing
        now = timezone.now()
        is_main = node.kind == NodeKind.MAIN
        loop = AgentLoop(
            run_id=node.run_id,
            node=node,
            policy=policy,
            # The Main Agent starts waiting: run_start's trigger wakes it (event-driven, never a clock).
            status=AgentLoopStatus.WAITING if is_main else AgentLoopStatus.SCHEDULED,
            scheduled_at=None if is_main else now,
        )
        loop.full_clean()
        loop.save()
        if not is_main:
            _send_step_on_commit(loop.pk, 0)
    return loop


def agent_loop_wake(*, node: ResearchNode, trigger: str, detail: dict[str, Any] | None = None) -> AgentLoop | None:
    """Give the node's loop a trigger; a waiting loop is scheduled at once. None when it has no loop."""
    with transaction.atomic():
        loop = AgentLoop.objects.select_for_update().filter(node=node).first()
        if loop is None or loop.status not in AGENT_LOOP_ACTIVE_STATES:
            return loop
        item = {"id": uuid.uuid4().hex, "trigger": trigger, "at": timezone.now().isoformat(), **(detail or {})}
        loop.inbox = [*loop.inbox, item]
        fields = ["inbox", "updated_at"]
        if loop.status == AgentLoopStatus.WAITING:
            loop.status = AgentLoopStatus.SCHEDULED
            loop.scheduled_at = timezone.now()
            fields += ["status", "scheduled_at"]
            _send_step_on_commit(loop.pk, loop.step)
        # A running step keeps going; its commit sees the new inbox item and schedules another step.
        loop.save(update_fields=fields)
    return loop


def agent_loops_sync(*, run: Run) -> list[AgentLoop]:
    """Create loops for the run's active Workers and Reviewers that have none (the Main just spawned them)."""
    if run.agent_mode == AgentMode.EXTERNAL:
        return []
    created = []
    missing = ResearchNode.objects.filter(
        run=run, kind__in=(NodeKind.WORKER, NodeKind.REVIEWER), status=NodeStatus.ACTIVE, agent_loop__isnull=True
    ).order_by("pk")
    for node in missing:
        created.append(agent_loop_ensure(node=node, policy=run.agent_mode))
    return created


def agent_loops_resend(*, run: Run) -> int:
    """Re-send the step message of every scheduled loop of ``run`` (after a resume or a restart).

    Duplicates are harmless: a step is claimed once, by the loop's cursor.
    """
    now = timezone.now()
    count = 0
    for loop in AgentLoop.objects.filter(run=run, status=AgentLoopStatus.SCHEDULED):
        wait = (loop.scheduled_at - now).total_seconds() if loop.scheduled_at else 0.0
        _send_step(loop.pk, loop.step, max(0.0, wait))
        count += 1
    return count


def agent_loops_wake_on_results(*, run: Run) -> int:
    """Wake Workers waiting for their jobs as soon as one of their experiments has ended.

    A waiting Worker's next step is scheduled a while ahead (``wait_seconds``, the fallback); the
    supervisor brings it forward when the records change, so results are read within a tick
    without the Worker polling the API every few seconds.
    """
    from apps.experiments.choices import EXPERIMENT_TERMINAL_STATES
    from apps.experiments.models import Experiment

    now = timezone.now()
    count = 0
    waiting = AgentLoop.objects.filter(run=run, status=AgentLoopStatus.SCHEDULED, scheduled_at__gt=now,
                                       node__kind=NodeKind.WORKER)  # fmt: skip
    for loop in waiting:
        ended = Experiment.objects.filter(owner_id=loop.node_id, status__in=EXPERIMENT_TERMINAL_STATES,
                                          updated_at__gte=loop.updated_at).exists()  # fmt: skip
        if not ended:
            continue
        # Conditional on the cursor: the step may have run meanwhile.
        if AgentLoop.objects.filter(pk=loop.pk, status=AgentLoopStatus.SCHEDULED, step=loop.step).update(
            scheduled_at=now, updated_at=now
        ):  # fmt: skip
            _send_step(loop.pk, loop.step)
            count += 1
    return count


def agent_loops_recover(*, run: Run, config: LoopConfig | None = None, dead_claims: set[str] | None = None) -> int:
    """Restart steps that were lost: claimed by a dead process, past the lease, or never delivered.

    ``dead_claims`` are claim prefixes (host:pid) known dead — a worker that just started knows its
    own host's previous processes are gone, and need not wait out the lease.
    """
    config = config or loop_config()
    now = timezone.now()
    count = 0
    running = AgentLoop.objects.filter(run=run, status=AgentLoopStatus.RUNNING)
    for loop in running:
        dead = any(loop.claimed_by.startswith(prefix) for prefix in dead_claims or ())
        stale = loop.claimed_at is not None and (now - loop.claimed_at).total_seconds() > config.lease_seconds
        if not (dead or stale):
            continue
        # Conditional on the same claim: the step may have finished while we looked.
        why = "worker gone" if dead else "lease expired"
        same_claim = AgentLoop.objects.filter(pk=loop.pk, status=AgentLoopStatus.RUNNING, claimed_by=loop.claimed_by)
        released = same_claim.update(
            status=AgentLoopStatus.SCHEDULED,
            claimed_by="",
            scheduled_at=now,
            updated_at=now,
            last_error=f"step {loop.step} was interrupted ({why}); re-running",
        )
        if released:
            _send_step(loop.pk, loop.step)
            count += 1
    lost_before = now - timedelta(seconds=config.lost_after_seconds)
    for loop in AgentLoop.objects.filter(run=run, status=AgentLoopStatus.SCHEDULED, scheduled_at__lt=lost_before):
        # Bumped so the next re-send waits another interval: a busy queue is not flooded with copies.
        if AgentLoop.objects.filter(pk=loop.pk, status=AgentLoopStatus.SCHEDULED, step=loop.step).update(
            scheduled_at=now, updated_at=now
        ):  # fmt: skip
            _send_step(loop.pk, loop.step)
            count += 1
    return count


# --- one step --------------------------------------------------------------------------------------


def agent_step_run(*, loop_id: int, step: int | None = None) -> None:
    """Run one step of one loop: claim, act through the policy, commit, enqueue the next."""
    config = loop_config()
    loop = AgentLoop.objects.select_related("run", "node").filter(pk=loop_id).first()
    if loop is None:
        logger.warning("agent loop %s does not exist; message dropped", loop_id)
        return
    run = loop.run
    if run.status in RUN_TERMINAL_STATES:
        _loop_close(loop, AgentLoopStatus.DONE, f"the run is {run.status}")
        return
    if run.status == RunStatus.PAUSED:
        return  # run_resume re-sends every scheduled step
    claim = worker_name()
    now = timezone.now()
    filters: dict[str, Any] = {"pk": loop_id, "status": AgentLoopStatus.SCHEDULED}
    if step is not None:
        filters["step"] = step
    # The conditional UPDATE is the claim: of two messages for one step, exactly one gets it.
    if AgentLoop.objects.filter(**filters).update(status=AgentLoopStatus.RUNNING, claimed_by=claim, claimed_at=now,
                                                  updated_at=now) != 1:  # fmt: skip
        return
    loop.refresh_from_db()
    _supervisor_check(run)
    node = loop.node
    if loop.stop_requested:
        _loop_close(loop, AgentLoopStatus.DONE, "stop requested", claim=claim)
        return
    if node.kind != NodeKind.MAIN and node.status != NodeStatus.ACTIVE:
        _loop_close(loop, AgentLoopStatus.DONE, f"{node.handle} is {node.status}", claim=claim)
        return
    if loop.step >= config.max_steps:
        _loop_close(loop, AgentLoopStatus.DONE, f"step limit {config.max_steps} reached", claim=claim)
        return
    from apps.research.services import run_budget_enforce

    run = run_budget_enforce(run=run)
    try:
        outcome, consumed = _act(loop, run, claim, config)
    except LostClaim:
        logger.warning("loop %s step %s: claim lost to another worker; stopping", loop.pk, loop.step)
        return
    except (ApiUnavailable, LLMUnavailable, TokenRejected) as exc:
        # Transient: the web process or the model endpoint is away (a restart, a rate limit).
        _release(loop, claim, f"{type(exc).__name__}: {exc}", config, transient=True)
        return
    except Exception as exc:
        logger.exception("loop %s (%s) step %s failed", loop.pk, node.handle, loop.step)
        _release(loop, claim, f"{type(exc).__name__}: {exc}", config, transient=False)
        return
    _commit(loop, claim, outcome, consumed, config)
    if node.kind == NodeKind.MAIN:
        # The Main Agent may have spawned Workers and Reviewers: give each its loop now.
        agent_loops_sync(run=Run.objects.get(pk=run.pk))


def _briefing(run: Run, node: ResearchNode) -> dict[str, Any]:
    """What the system tells an agent about its assignment (as a person would brief a colleague)."""
    benchmark = run.benchmark
    policy = run.policy or {}
    return {
        "run": run.name,
        "role": _role(node),
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
        "policy": {k: v for k, v in policy.items() if k not in ("allowed_teachers",)},
    }


def step_view(loop: AgentLoop, run: Run, claim: str, config: LoopConfig, client: ExposClient) -> StepView:
    """The view of ``loop``'s current step as its policy sees it (journal included, for replay)."""
    node = loop.node
    return StepView(
        loop_id=loop.pk,
        role=_role(node),
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
        _journal=list(loop.journal or []),
        _claim=claim,
        _llm=_llm_factory(_role(node)) if loop.policy == AgentMode.LLM else None,
    )


def _act(loop: AgentLoop, run: Run, claim: str, config: LoopConfig) -> tuple[Outcome, list[str]]:
    from workers.agents.policies import policy_for

    node = loop.node
    client = ExposClient(base_url=api_base_url(), token=node_token(node), role=_role(node))
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
    finally:
        client.close()
    return outcome, [str(item.get("id")) for item in view.inbox]


def _llm_factory(role: str) -> Any:
    def build() -> Any:
        from workers.agents.llm import ChatLLM, llm_config

        return ChatLLM(llm_config(role))

    return build


def _commit(loop: AgentLoop, claim: str, outcome: Outcome, consumed: list[str], config: LoopConfig) -> None:
    now = timezone.now()
    with transaction.atomic():
        locked = AgentLoop.objects.select_for_update().get(pk=loop.pk)
        if locked.status != AgentLoopStatus.RUNNING or locked.claimed_by != claim:
            logger.warning("loop %s step %s: claim lost before commit; result dropped", loop.pk, loop.step)
            return
        remaining = [item for item in locked.inbox if str(item.get("id")) not in set(consumed)]
        next_step = locked.step + 1
        status, scheduled_at, countdown = AgentLoopStatus.SCHEDULED, now, 0.0
        if outcome.next == "done":
            status, scheduled_at = AgentLoopStatus.DONE, None
        elif outcome.next == "idle":
            # A trigger that arrived during the step is handled now rather than waiting for another.
            if remaining:
                status = AgentLoopStatus.SCHEDULED
            else:
                status, scheduled_at = AgentLoopStatus.WAITING, None
        elif outcome.next == "wait":
            countdown = max(0.0, outcome.wait_seconds or config.poll_seconds)
            if remaining:
                countdown = 0.0
            scheduled_at = now + timedelta(seconds=countdown)
        AgentLoop.objects.filter(pk=locked.pk).update(
            state=outcome.state,
            step=next_step,
            journal=[],
            inbox=remaining,
            status=status,
            scheduled_at=scheduled_at,
            claimed_by="",
            last_error="" if not outcome.note.startswith("error:") else outcome.note[6:].strip(),
            failures=0,
            finished_at=now if status == AgentLoopStatus.DONE else None,
            updated_at=now,
        )
        if status == AgentLoopStatus.SCHEDULED:
            _send_step_on_commit(locked.pk, next_step, countdown)


def _release(loop: AgentLoop, claim: str, error: str, config: LoopConfig, *, transient: bool) -> None:
    """A step failed: keep its journal, and retry it with backoff, or fail the loop after too many."""
    now = timezone.now()
    with transaction.atomic():
        locked = AgentLoop.objects.select_for_update().get(pk=loop.pk)
        if locked.status != AgentLoopStatus.RUNNING or locked.claimed_by != claim:
            return
        failures = locked.failures + (0 if transient else 1)
        if failures >= config.max_failures:
            AgentLoop.objects.filter(pk=locked.pk).update(
                status=AgentLoopStatus.FAILED, claimed_by="", last_error=error[:5000], failures=failures,
                finished_at=now, updated_at=now,
            )  # fmt: skip
            return
        countdown = 5.0 if transient else min(2.0**failures, 60.0)
        AgentLoop.objects.filter(pk=locked.pk).update(
            status=AgentLoopStatus.SCHEDULED, claimed_by="", last_error=error[:5000], failures=failures,
            scheduled_at=now + timedelta(seconds=countdown), updated_at=now,
        )  # fmt: skip
        _send_step_on_commit(locked.pk, locked.step, countdown)


def _loop_close(loop: AgentLoop, status: str, reason: str, *, claim: str | None = None) -> None:
    now = timezone.now()
    qs = AgentLoop.objects.filter(pk=loop.pk, status__in=AGENT_LOOP_ACTIVE_STATES)
    if claim is not None:
        qs = qs.filter(claimed_by=claim)
    qs.update(status=status, claimed_by="", last_error=reason, finished_at=now, scheduled_at=None, updated_at=now)


def agent_loops_close(*, run: Run, reason: str) -> int:
    """End every loop of a run that has ended (their tokens stopped working with it)."""
    now = timezone.now()
    return AgentLoop.objects.filter(run=run, status__in=AGENT_LOOP_ACTIVE_STATES).update(
        status=AgentLoopStatus.DONE, claimed_by="", last_error=reason, finished_at=now, scheduled_at=None,
        updated_at=now,
    )  # fmt: skip


# --- the run supervisor ------------------------------------------------------------------------------


def run_supervise_start(*, run: Run) -> None:
    """Send the supervisor's current tick (on commit). A duplicate tick is dropped by its number."""
    loop = AgentLoop.objects.filter(run=run, node__kind=NodeKind.MAIN).first()
    if loop is None:
        return
    tick = loop.supervisor_tick
    transaction.on_commit(lambda: _send_tick(run.pk, tick))


def _supervisor_check(run: Run) -> None:
    """Restart the supervisor when it has not ticked for a while (its message was lost)."""
    config = loop_config()
    loop = AgentLoop.objects.filter(run=run, node__kind=NodeKind.MAIN).only("supervisor_tick", "supervised_at").first()
    if loop is None or loop.supervised_at is None:
        return
    if (timezone.now() - loop.supervised_at).total_seconds() > max(30.0, 6 * config.supervise_seconds):
        _send_tick(run.pk, loop.supervisor_tick)


def run_supervise(*, run_id: int, tick: int) -> None:
    """One supervisor tick: budgets, lost steps, new loops, and the end of the run."""
    from apps.research import services as research

    config = loop_config()
    now = timezone.now()
    # Numbered ticks: of a tick sent twice (a restart re-sends it), exactly one runs.
    if AgentLoop.objects.filter(run_id=run_id, node__kind=NodeKind.MAIN, supervisor_tick=tick).update(
        supervisor_tick=F("supervisor_tick") + 1, supervised_at=now
    ) != 1:  # fmt: skip
        return
    run = Run.objects.select_related("benchmark").filter(pk=run_id).first()
    if run is None or run.status in RUN_TERMINAL_STATES:
        if run is not None:
            agent_loops_close(run=run, reason=f"the run is {run.status}")
        return
    if run.status != RunStatus.PAUSED:
        run = research.run_budget_enforce(run=run)
        agent_loops_sync(run=run)
        agent_loops_recover(run=run, config=config)
        agent_loops_wake_on_results(run=run)
        _integrity_reconcile(run)
        run = research.run_advance(run=run, grace_seconds=config.final_grace_seconds,
                                   quiet_seconds=config.quiet_seconds)  # fmt: skip
    if run.status in RUN_TERMINAL_STATES:
        agent_loops_close(run=run, reason=f"the run is {run.status}")
        return
    _send_tick(run.pk, tick + 1, config.supervise_seconds)


def _supervisor_state_add(run: Run, key: str, values: list[str]) -> None:
    """Remember handles the supervisor has dealt with (on the Main loop row, under its lock)."""
    with transaction.atomic():
        locked = AgentLoop.objects.select_for_update().filter(run=run, node__kind=NodeKind.MAIN).first()
        if locked is None:
            return
        state = dict(locked.supervisor_state or {})
        state[key] = sorted({*state.get(key, []), *values})
        AgentLoop.objects.filter(pk=locked.pk).update(supervisor_state=state)


def _supervisor_seen(run: Run, key: str) -> set[str]:
    loop = AgentLoop.objects.filter(run=run, node__kind=NodeKind.MAIN).only("supervisor_state").first()
    return set((loop.supervisor_state or {}).get(key, [])) if loop is not None else set()


def _integrity_reconcile(run: Run, *, settle_seconds: float = 30.0) -> None:
    """Make sure every ended experiment gets its post-checks and every finished Worker its reporting checks.

    The pipeline and Worker finalization are the primary callers of the integrity hooks; this is the
    orchestrator's reconciliation (like ``state_sync_results`` for jobs), asking once per experiment
    that has no findings a while after it ended, and once per finalized Worker. The checks are
    idempotent, so a duplicate request only repeats work.
    """
    try:
        from apps.integrity.services import integrity_on_experiment_finished, integrity_on_report
    except ImportError:  # no integrity layer in this deployment
        return
    from django.db.models import Exists, OuterRef

    from apps.experiments.choices import EXPERIMENT_TERMINAL_STATES
    from apps.experiments.models import Experiment
    from apps.integrity.choices import Subcategory
    from apps.integrity.models import IntegrityFinding

    settled = timezone.now() - timedelta(seconds=settle_seconds)
    asked = _supervisor_seen(run, "integrity_checked")
    # "Unchecked": no finding of the first (non-reporting) check, whatever the reporting checks left.
    checked = IntegrityFinding.objects.filter(experiment=OuterRef("pk"), subcategory=Subcategory.WEIGHT_PROVENANCE)
    ended = (
        Experiment.objects.filter(run=run, status__in=EXPERIMENT_TERMINAL_STATES, updated_at__lt=settled,
                                  jobs__started_at__isnull=False)
        .exclude(Exists(checked))
        .exclude(handle__in=asked)
        .distinct()
    )  # fmt: skip
    handles = []
    for experiment in ended:
        with transaction.atomic():
            integrity_on_experiment_finished(experiment=experiment)
        handles.append(experiment.handle)
    if handles:
        _supervisor_state_add(run, "integrity_checked", handles)
    reported = _supervisor_seen(run, "integrity_reported")
    finalized = ResearchNode.objects.filter(run=run, kind=NodeKind.WORKER, status=NodeStatus.FINALIZED).exclude(
        handle__in=reported)  # fmt: skip
    workers = []
    for node in finalized:
        with transaction.atomic():
            integrity_on_report(run=run, node=node)
        workers.append(node.handle)
    if workers:
        _supervisor_state_add(run, "integrity_reported", workers)


def agent_stack_resume(*, dead_claim_prefixes: set[str] | None = None) -> int:
    """After a restart: restart every active run's supervisor and re-send its scheduled steps.

    Called when an agents-queue worker starts. Nothing is created twice: steps are claimed by
    cursor, supervisor ticks by number, jobs by their own claims.
    """
    count = 0
    active = Run.objects.filter(status__in=(RunStatus.RUNNING, RunStatus.STOPPING, RunStatus.FINAL_EVAL))
    for run in active:
        loop = AgentLoop.objects.filter(run=run, node__kind=NodeKind.MAIN).first()
        if loop is None:
            continue
        _send_tick(run.pk, loop.supervisor_tick)
        agent_loops_recover(run=run, dead_claims=dead_claim_prefixes)
        count += agent_loops_resend(run=run)
    return count
