"""The agent loops' state machine and their scheduling: every write to ``AgentLoop`` is here.

An agent is a chain of steps, one Celery message each (STYLE.md 22). This module owns the loop
rows and the messages that drive them; the step itself (the policy acting through the REST API)
and the supervisor tick's body run in ``workers.agents.loop``, which calls these services:

- **scheduling**: ``agent_loop_ensure`` (a node gets its loop), ``agent_loop_wake`` (a trigger
  for the Main Agent), ``agent_loops_sync`` (loops for newly spawned nodes), ``agent_loops_resend``
  (after a resume or a restart), ``agent_loops_wake_on_results`` (a Worker's jobs ended),
  ``agent_loops_recover`` (lost steps), ``agent_loops_close`` (the run ended);
- **one step's transitions**: ``agent_loop_claim`` (scheduled -> running for one process),
  ``agent_loop_journal_save``, ``agent_loop_step_commit`` (the cursor moves on and the next step
  is enqueued), ``agent_loop_step_release`` (a failed attempt, retried with backoff), and
  ``agent_loop_close``;
- **the run supervisor's clock**: ``run_supervise_start``, ``run_supervise_check``,
  ``run_supervise_tick_claim``, ``run_supervise_next``, and its bookkeeping;
- ``agent_stack_resume``: an agents worker that starts picks every active run up again;
- ``agent_messages_republish``: the reaper re-sends supervisor ticks and steps the broker lost.

The Main Agent's trigger schedule (issue 32): it is woken by every ``worker_finalize`` and every
``review_report`` alike, whether or not a review is pending — a pending review is information still
to come, never a gate, so a result is always a planning step that can keep the strongest line
moving; nothing here waits for a count of results before waking it. The role prompt
(prompts/main.md) and the trigger text (workers/agents/policies/llm.py) say the same.

Messages carry ids only and are sent by task name (apps.core.queues), so apps/ never imports the
workers that run them. Every send that follows a row change goes out on commit: a worker that
got the message before the row is visible would find nothing to claim.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, QuerySet
from django.db.models.functions import Coalesce

from apps.core.clock import db_now
from apps.core.queues import Queue, TaskName
from apps.experiments.choices import EXPERIMENT_TERMINAL_STATES
from apps.experiments.events import event_append
from apps.experiments.models import Experiment
from apps.research.agent_config import LoopConfig, loop_config
from apps.research.choices import (
    AGENT_LOOP_ACTIVE_STATES,
    RUN_ACTIVE_STATES,
    AgentLoopStatus,
    AgentMode,
    NodeKind,
    NodeStatus,
    RunStatus,
)
from apps.research.models import AgentLoop, ResearchNode, Run
from apps.research.selectors import harness_plays
from rsiweb.celery import app

# Outcomes of a step (workers.agents.policies.Outcome.next): when the loop steps again.
STEP_CONTINUE, STEP_WAIT, STEP_IDLE, STEP_DONE = "continue", "wait", "idle", "done"


class LostClaim(RuntimeError):
    """Another process took this step over (the lease ran out); this one must stop at once."""


def node_role(node: ResearchNode) -> str:
    """The agent role of a node, as tokens, tools and prompts name it."""
    return {NodeKind.MAIN: "main", NodeKind.WORKER: "worker", NodeKind.REVIEWER: "reviewer"}[NodeKind(node.kind)]


# --- messages ----------------------------------------------------------------------------------------


def _send_step(loop_id: int, step: int, countdown: float = 0.0) -> None:
    app.send_task(TaskName.AGENT_STEP, kwargs={"loop_id": loop_id, "step": step}, queue=Queue.AGENTS,
                  countdown=max(0.0, countdown) or None)  # fmt: skip


def _send_step_on_commit(loop_id: int, step: int, countdown: float = 0.0) -> None:
    # After commit: a worker that got the message before the row is visible would find nothing to claim.
    transaction.on_commit(lambda: _send_step(loop_id, step, countdown))


def _send_tick(run_id: int, tick: int, countdown: float = 0.0) -> None:
    app.send_task(TaskName.RUN_SUPERVISE, kwargs={"run_id": run_id, "tick": tick}, queue=Queue.AGENTS,
                  countdown=max(0.0, countdown) or None)  # fmt: skip


# --- scheduling --------------------------------------------------------------------------------------


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
        is_main = node.kind == NodeKind.MAIN
        # The Main Agent starts waiting: run_start's trigger wakes it (event-driven, never a clock).
        # External harnesses drive their own agents: that Main loop row only numbers the
        # supervisor's ticks, and is done from the start.
        status = AgentLoopStatus.SCHEDULED
        if is_main:
            status = AgentLoopStatus.DONE if policy == AgentMode.EXTERNAL else AgentLoopStatus.WAITING
        loop = AgentLoop(
            run_id=node.run_id,
            node=node,
            policy=policy,
            status=status,
            scheduled_at=db_now() if status == AgentLoopStatus.SCHEDULED else None,
        )
        loop.full_clean()
        loop.save()
        if status == AgentLoopStatus.SCHEDULED:
            _send_step_on_commit(loop.pk, 0)
    return loop


def agent_loop_wake(*, node: ResearchNode, trigger: str, detail: dict[str, Any] | None = None) -> AgentLoop | None:
    """Give the node's loop a trigger; a waiting loop is scheduled at once. None when it has no loop."""
    with transaction.atomic():
        loop = AgentLoop.objects.select_for_update().filter(node=node).first()
        if loop is None or loop.status not in AGENT_LOOP_ACTIVE_STATES:
            return loop
        item = {"id": uuid.uuid4().hex, "trigger": trigger, "at": db_now().isoformat(), **(detail or {})}
        loop.inbox = [*loop.inbox, item]
        fields = ["inbox", "updated_at"]
        if loop.status == AgentLoopStatus.WAITING:
            loop.status = AgentLoopStatus.SCHEDULED
            loop.scheduled_at = db_now()
            fields += ["status", "scheduled_at"]
            _send_step_on_commit(loop.pk, loop.step)
        # A running step keeps going; its commit sees the new inbox item and schedules another step.
        loop.save(update_fields=fields)
    return loop


def agent_loops_sync(*, run: Run) -> list[AgentLoop]:
    """Create loops for the run's active Workers and Reviewers that have none (the Main just spawned them).

    In an external run the harness plays its Workers; its Reviewers are ours (the heuristic Reviewer)
    unless the harness plays them too (``harness_plays``).
    """
    missing = ResearchNode.objects.filter(
        run=run, kind__in=(NodeKind.WORKER, NodeKind.REVIEWER), status=NodeStatus.ACTIVE, agent_loop__isnull=True
    ).order_by("pk")
    if run.agent_mode == AgentMode.EXTERNAL:
        ours = [node for node in missing.filter(kind=NodeKind.REVIEWER) if not harness_plays(run, node)]
        return [agent_loop_ensure(node=node, policy=AgentMode.HEURISTIC) for node in ours]
    return [agent_loop_ensure(node=node, policy=run.agent_mode) for node in missing]


def agent_loops_resend(*, run: Run) -> int:
    """Re-send the step message of every scheduled loop of ``run`` (after a resume or a restart).

    Duplicates are harmless: a step is claimed once, by the loop's cursor.
    """
    now = db_now()
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
    now = db_now()
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


def _interrupted(loop: AgentLoop, *, now: datetime, config: LoopConfig, dead_claims: set[str]) -> str:
    """Why the running step of ``loop`` is presumed lost, or "" while it is alive."""
    if any(loop.claimed_by.startswith(prefix) for prefix in dead_claims):
        return "worker gone"
    beat = loop.heartbeat_at or loop.claimed_at
    if beat is not None and (now - beat).total_seconds() > config.stale_seconds:
        return f"no heartbeat from {loop.claimed_by or 'its worker'} for {(now - beat).total_seconds():.0f}s"
    if loop.claimed_at is not None and (now - loop.claimed_at).total_seconds() > config.lease_seconds:
        return "lease expired"
    return ""


def agent_loops_recover(*, run: Run, config: LoopConfig | None = None, dead_claims: set[str] | None = None) -> int:
    """Restart steps that were lost: claimed by a dead process, silent, past the lease, or never delivered.

    A running step's process beats (``agent_loop_heartbeat``); one silent for ``stale_seconds``
    died — a pool child killed alone, as by the OOM killer, while its worker lives on — and its
    step is re-run from the journal. The lease only ends a step that beats but never finishes.
    ``dead_claims`` are claim prefixes (host:pid) known dead — a worker that just started knows its
    own host's previous processes are gone, and need not wait at all.
    """
    config = config or loop_config()
    now = db_now()
    count = 0
    for loop in AgentLoop.objects.filter(run=run, status=AgentLoopStatus.RUNNING).select_related("node"):
        why = _interrupted(loop, now=now, config=config, dead_claims=dead_claims or set())
        if not why:
            continue
        with transaction.atomic():
            # Conditional on the same claim: the step may have finished while we looked.
            same_claim = AgentLoop.objects.filter(pk=loop.pk, status=AgentLoopStatus.RUNNING,
                                                  claimed_by=loop.claimed_by)  # fmt: skip
            released = same_claim.update(
                status=AgentLoopStatus.SCHEDULED,
                claimed_by="",
                scheduled_at=now,
                updated_at=now,
                last_error=f"step {loop.step} was interrupted ({why}); re-running",
            )
            if not released:
                continue
            # In the run's record: an operator sees which steps were re-run and why.
            event_append(run=run, type="agent.step_interrupted", actor="supervisor", role="system",
                         arguments={"node": loop.node.handle, "step": loop.step, "claim": loop.claimed_by,
                                    "why": why})  # fmt: skip
            _send_step_on_commit(loop.pk, loop.step)
        count += 1
    return count + _resend_unclaimed_steps(run=run, now=now, config=config)


def _resend_unclaimed_steps(*, run: Run, now: datetime, config: LoopConfig) -> int:
    """Re-send the message of steps due for longer than ``lost_after_seconds`` that nobody claimed."""
    count = 0
    lost_before = now - timedelta(seconds=config.lost_after_seconds)
    for loop in AgentLoop.objects.filter(run=run, status=AgentLoopStatus.SCHEDULED, scheduled_at__lt=lost_before):
        # Bumped so the next re-send waits another interval: a busy queue is not flooded with copies.
        if AgentLoop.objects.filter(pk=loop.pk, status=AgentLoopStatus.SCHEDULED, step=loop.step).update(
            scheduled_at=now, updated_at=now
        ):  # fmt: skip
            _send_step(loop.pk, loop.step)
            count += 1
    return count


def agent_loops_close(*, run: Run, reason: str) -> int:
    """End every loop of a run that has ended (their tokens stopped working with it)."""
    now = db_now()
    return AgentLoop.objects.filter(run=run, status__in=AGENT_LOOP_ACTIVE_STATES).update(
        status=AgentLoopStatus.DONE, claimed_by="", last_error=reason, finished_at=now, scheduled_at=None,
        updated_at=now,
    )  # fmt: skip


# --- one step's transitions ------------------------------------------------------------------------------


def agent_loop_claim(*, loop_id: int, step: int | None, claim: str) -> bool:
    """Move a scheduled loop to running for ``claim``; False when another message got there first."""
    now = db_now()
    filters: dict[str, Any] = {"pk": loop_id, "status": AgentLoopStatus.SCHEDULED}
    if step is not None:
        filters["step"] = step
    # The conditional UPDATE is the claim: of two messages for one step, exactly one gets it.
    claimed = AgentLoop.objects.filter(**filters).update(status=AgentLoopStatus.RUNNING, claimed_by=claim,
                                                         claimed_at=now, heartbeat_at=now, updated_at=now)  # fmt: skip
    return claimed == 1


def agent_loop_heartbeat(*, loop_id: int, claim: str) -> bool:
    """The running step of ``claim`` is alive; False when the step is no longer its own."""
    # Conditional on the claim: a step taken over after a stale beat must not look alive again.
    # Not updated_at: other services read it as the loop's last change.
    beat = AgentLoop.objects.filter(pk=loop_id, status=AgentLoopStatus.RUNNING, claimed_by=claim).update(
        heartbeat_at=db_now()
    )
    return beat == 1


def agent_loop_journal_save(*, loop_id: int, claim: str, journal: list[dict[str, Any]]) -> None:
    """Persist the current step's journal at once: a crash after this replays, never re-asks.

    Raises LostClaim when the step is no longer ``claim``'s (its lease was taken over).
    """
    # Conditional on the claim: a step whose lease was taken over must not write anything more.
    saved = AgentLoop.objects.filter(pk=loop_id, status=AgentLoopStatus.RUNNING, claimed_by=claim).update(
        journal=journal, updated_at=db_now()
    )
    if saved != 1:
        raise LostClaim(f"loop {loop_id} is no longer claimed by {claim}")


def agent_loop_step_commit(
    *,
    loop_id: int,
    claim: str,
    state: dict[str, Any],
    next_step: str,
    wait_seconds: float,
    note: str,
    consumed: list[str],
    config: LoopConfig,
) -> bool:
    """Save a step's result: the policy state and the cursor together; the next step goes on commit.

    ``next_step`` is the policy's outcome (``continue``, ``wait``, ``idle``, ``done``); ``consumed``
    the inbox items the step handled. False when the claim was lost before the commit (the
    result is dropped: the process that took the step over runs it again).
    """
    now = db_now()
    with transaction.atomic():
        locked = AgentLoop.objects.select_for_update().get(pk=loop_id)
        if locked.status != AgentLoopStatus.RUNNING or locked.claimed_by != claim:
            return False
        remaining = [item for item in locked.inbox if str(item.get("id")) not in set(consumed)]
        following = locked.step + 1
        status, countdown = AgentLoopStatus.SCHEDULED, 0.0
        scheduled_at: datetime | None = now
        if next_step == STEP_DONE:
            status, scheduled_at = AgentLoopStatus.DONE, None
        elif next_step == STEP_IDLE:
            # A trigger that arrived during the step is handled now rather than waiting for another.
            if not remaining:
                status, scheduled_at = AgentLoopStatus.WAITING, None
        elif next_step == STEP_WAIT:
            countdown = 0.0 if remaining else max(0.0, wait_seconds or config.poll_seconds)
            scheduled_at = now + timedelta(seconds=countdown)
        AgentLoop.objects.filter(pk=locked.pk).update(
            state=state,
            step=following,
            journal=[],
            inbox=remaining,
            status=status,
            scheduled_at=scheduled_at,
            claimed_by="",
            last_error=note[6:].strip() if note.startswith("error:") else "",
            failures=0,
            finished_at=now if status == AgentLoopStatus.DONE else None,
            updated_at=now,
        )
        if status == AgentLoopStatus.SCHEDULED:
            _send_step_on_commit(locked.pk, following, countdown)
    return True


def agent_loop_step_release(*, loop_id: int, claim: str, error: str, config: LoopConfig, transient: bool) -> None:
    """A step failed: keep its journal, and retry it with backoff, or fail the loop after too many."""
    now = db_now()
    with transaction.atomic():
        locked = AgentLoop.objects.select_for_update().get(pk=loop_id)
        if locked.status != AgentLoopStatus.RUNNING or locked.claimed_by != claim:
            return
        # A transient failure (the API or the model endpoint away) does not count towards failing.
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


def agent_loop_close(*, loop_id: int, status: str, reason: str, claim: str | None = None) -> None:
    """End one loop (``done`` or ``failed``); with ``claim``, only if that process still holds its step."""
    now = db_now()
    qs = AgentLoop.objects.filter(pk=loop_id, status__in=AGENT_LOOP_ACTIVE_STATES)
    if claim is not None:
        qs = qs.filter(claimed_by=claim)
    qs.update(status=status, claimed_by="", last_error=reason, finished_at=now, scheduled_at=None, updated_at=now)


# --- the run supervisor's clock ----------------------------------------------------------------------------


def _main_loop(run: Run | int) -> QuerySet[AgentLoop]:
    return AgentLoop.objects.filter(run=run, node__kind=NodeKind.MAIN)


def run_supervise_start(*, run: Run) -> None:
    """Send the supervisor's current tick (on commit). A duplicate tick is dropped by its number."""
    loop = _main_loop(run).first()
    if loop is None:
        return
    tick = loop.supervisor_tick
    transaction.on_commit(lambda: _send_tick(run.pk, tick))


def run_supervise_check(*, run: Run, config: LoopConfig | None = None) -> None:
    """Restart the supervisor when it has not ticked for a while (its message was lost)."""
    config = config or loop_config()
    loop = _main_loop(run).only("supervisor_tick", "supervised_at").first()
    if loop is None or loop.supervised_at is None:
        return
    if (db_now() - loop.supervised_at).total_seconds() > max(30.0, 6 * config.supervise_seconds):
        _send_tick(run.pk, loop.supervisor_tick)


def run_supervise_tick_claim(*, run_id: int, tick: int) -> bool:
    """Take tick ``tick`` of the run's supervisor; False when it ran already (a duplicated message)."""
    # Numbered ticks: of a tick sent twice (a restart re-sends it), exactly one runs.
    taken = (
        _main_loop(run_id)
        .filter(supervisor_tick=tick)
        .update(supervisor_tick=F("supervisor_tick") + 1, supervised_at=db_now())
    )
    return taken == 1


def run_supervise_next(*, run: Run, tick: int, countdown: float) -> None:
    """Send the supervisor's next tick, ``countdown`` seconds from now."""
    _send_tick(run.pk, tick, countdown)


def run_supervisor_state_add(*, run: Run, key: str, values: list[str]) -> None:
    """Remember handles the supervisor has dealt with (on the Main loop row, under its lock)."""
    with transaction.atomic():
        locked = _main_loop(run).select_for_update().first()
        if locked is None:
            return
        state = dict(locked.supervisor_state or {})
        state[key] = sorted({*state.get(key, []), *values})
        AgentLoop.objects.filter(pk=locked.pk).update(supervisor_state=state)


def run_supervisor_state_get(*, run: Run, key: str) -> set[str]:
    """The handles the supervisor has remembered under ``key``."""
    loop = _main_loop(run).only("supervisor_state").first()
    return set((loop.supervisor_state or {}).get(key, [])) if loop is not None else set()


def agent_messages_republish(*, config: LoopConfig | None = None) -> int:
    """Re-send the agent messages the broker lost: supervisor ticks and unclaimed steps.

    The agents' share of the reaper that every worker runs (``workers.runtime``), next to the
    re-send of unclaimed job messages. A broker restarted without persistence drops the queued
    messages and the countdown messages a worker held; a send that failed while the broker was
    down drops the next one. The supervisor restarts lost steps, but a lost tick ends the
    supervisor itself, and with it every run's progress. So: an active run whose supervisor has
    not ticked for ``max(lost_after_seconds, 6 ticks)`` gets its current tick again, and its
    steps due and unclaimed for ``lost_after_seconds`` get theirs. Copies are harmless: a tick
    is taken by its number and a step by the loop's cursor, so each still runs once. Returns the
    number of messages sent.
    """
    config = config or loop_config()
    now = db_now()
    tick_lost_before = now - timedelta(seconds=max(config.lost_after_seconds, 6 * config.supervise_seconds))
    count = 0
    for run in Run.objects.filter(status__in=RUN_ACTIVE_STATES):
        loop = (
            _main_loop(run)
            .annotate(ticked_at=Coalesce("supervised_at", "created_at"))
            .filter(ticked_at__lt=tick_lost_before)
            .only("pk", "supervisor_tick", "supervised_at")
            .first()
        )
        # Conditional on the tick not having moved, and bumped so that the next copy waits
        # another interval: reapers of several workers racing here send one copy between them.
        if loop is not None and AgentLoop.objects.filter(
            pk=loop.pk, supervisor_tick=loop.supervisor_tick, supervised_at=loop.supervised_at
        ).update(supervised_at=now):  # fmt: skip
            _send_tick(run.pk, loop.supervisor_tick)
            count += 1
        count += _resend_unclaimed_steps(run=run, now=now, config=config)
    return count


def agent_stack_resume(*, dead_claim_prefixes: set[str] | None = None) -> int:
    """After a restart: restart every active run's supervisor and re-send its scheduled steps.

    Called when an agents-queue worker starts. Nothing is created twice: steps are claimed by
    cursor, supervisor ticks by number, jobs by their own claims.
    """
    count = 0
    active = Run.objects.filter(status__in=(RunStatus.RUNNING, RunStatus.STOPPING, RunStatus.FINAL_EVAL))
    for run in active:
        loop = _main_loop(run).first()
        if loop is None:
            continue
        _send_tick(run.pk, loop.supervisor_tick)
        agent_loops_recover(run=run, dead_claims=dead_claim_prefixes)
        count += agent_loops_resend(run=run)
    return count
