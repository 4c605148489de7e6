"""Agent tasks (queue ``agents``): one agent step, or one run-supervisor tick, per message.

Thin by design (STYLE.md 18, 22): the message carries ids only; the loop machinery in
``workers.agents.loop`` claims, runs and re-enqueues. No task holds a worker in a loop.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from celery import shared_task, signals

from workers.agents import loop

logger = logging.getLogger(__name__)

# A step is short (one model turn, a few HTTP calls); these limits only stop a hung one.
STEP_SOFT_LIMIT_SECONDS = 900
STEP_HARD_LIMIT_SECONDS = 960


@shared_task(name="workers.agents.agent_step_task", soft_time_limit=STEP_SOFT_LIMIT_SECONDS,
             time_limit=STEP_HARD_LIMIT_SECONDS, ignore_result=True)  # fmt: skip
def agent_step_task(*, loop_id: int, step: int | None = None) -> None:
    """Run step ``step`` of agent loop ``loop_id`` (a stale or duplicated message does nothing)."""
    loop.agent_step_run(loop_id=loop_id, step=step)


@shared_task(name="workers.agents.run_supervise_task", soft_time_limit=300, time_limit=330, ignore_result=True)
def run_supervise_task(*, run_id: int, tick: int) -> None:
    """One tick of a run's supervisor: budgets, lost steps, new loops, the end of the run."""
    loop.run_supervise(run_id=run_id, tick=tick)


def _dead_local_claims() -> set[str]:
    """Claim prefixes of this host's processes that no longer exist (a restart left their steps running)."""
    from apps.research.choices import AgentLoopStatus
    from apps.research.models import AgentLoop

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
    if loop.QUEUE not in queues:
        return
    from django.db import connection

    try:
        resent = loop.agent_stack_resume(dead_claim_prefixes=_dead_local_claims())
        logger.info("agents worker ready: resumed active runs (%d scheduled steps re-sent)", resent)
    except Exception:
        logger.exception("could not resume agent loops at start-up")
    finally:
        connection.close()  # a pool child forked later must not inherit this connection
