"""Agent tasks (queue ``agents``): one agent step, or one run-supervisor tick, per message.

Thin by design (STYLE.md 18, 22): the message carries ids only; the step runner in
``workers.agents.loop`` claims, runs and re-enqueues through ``apps.research.agent_loops``. No
task holds a worker in a loop. The task and queue names are declared once, in apps.core.queues.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from celery import shared_task, signals
from django.db import connection

from apps.core.queues import Queue, TaskName
from apps.dojo.suites import suite_advance, suites_resume
from apps.flows import supervisor
from apps.research.agent_loops import agent_stack_resume
from apps.research.choices import AgentLoopStatus
from apps.research.models import AgentLoop
from workers.agents import loop

logger = logging.getLogger(__name__)

# A step is short (one model turn, a few HTTP calls); these limits only stop a hung one.
STEP_SOFT_LIMIT_SECONDS = 900
STEP_HARD_LIMIT_SECONDS = 960


@shared_task(name=TaskName.AGENT_STEP, soft_time_limit=STEP_SOFT_LIMIT_SECONDS,
             time_limit=STEP_HARD_LIMIT_SECONDS, ignore_result=True)  # fmt: skip
def agent_step_task(*, loop_id: int, step: int | None = None) -> None:
    """Run step ``step`` of agent loop ``loop_id`` (a stale or duplicated message does nothing)."""
    loop.agent_step_run(loop_id=loop_id, step=step)


@shared_task(name=TaskName.RUN_SUPERVISE, soft_time_limit=300, time_limit=330, ignore_result=True)
def run_supervise_task(*, run_id: int, tick: int) -> None:
    """One tick of a run's supervisor: budgets, lost steps, new loops, the end of the run."""
    supervisor.run_supervise(run_id=run_id, tick=tick)


@shared_task(name=TaskName.SUITE_ADVANCE, soft_time_limit=300, time_limit=330, ignore_result=True)
def suite_advance_task(*, suite_id: int, tick: int) -> None:
    """One tick of an agent suite's clock: start queued cells as runs end, finish the suite."""
    suite_advance(suite_id=suite_id, tick=tick)


def _dead_local_claims() -> set[str]:
    """Claim prefixes of this host's processes that no longer exist (a restart left their steps running)."""
    host = socket.gethostname()
    dead = set()
    claims = AgentLoop.objects.filter(status=AgentLoopStatus.RUNNING, claimed_by__startswith=f"{host}:")
    for claim in claims.values_list("claimed_by", flat=True):
        parts = claim.split(":")
        try:
            pid = int(parts[1])
        except (IndexError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            dead.add(f"{host}:{pid}:")
        except PermissionError:
            continue  # alive, someone else's
    return dead


@signals.worker_ready.connect
def agents_resume(sender: Any = None, **kwargs: Any) -> None:
    """When a worker consuming the agents queue starts, pick up every active run where it stopped."""
    try:
        queues = {q.name for q in sender.app.amqp.queues.consume_from.values()} if sender is not None else set()
    except AttributeError:
        queues = set()
    if Queue.AGENTS not in queues:
        return
    try:
        resent = agent_stack_resume(dead_claim_prefixes=_dead_local_claims())
        logger.info("agents worker ready: resumed active runs (%d scheduled steps re-sent)", resent)
        logger.info("agents worker ready: %d running suites' clocks re-sent", suites_resume())
    except Exception:
        logger.exception("could not resume agent loops at start-up")
    finally:
        connection.close()  # a pool child forked later must not inherit this connection
