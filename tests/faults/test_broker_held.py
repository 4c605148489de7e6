"""Redis crashes while the agents worker holds unacknowledged messages; the worker lives on.

A worker holds a message unacknowledged while it runs it (acks late) and while it waits for a
countdown's time. Celery 5.7 closes the lost connection's channel twice, and the second close,
with messages to restore, died in kombu's Redis channel ("'NoneType' object has no attribute
'hostname'", rsiweb/celery.py). An idle worker survived, so tests/faults/test_broker.py passed.
Here a run's supervisor and Main Agent keep the agents worker busy, countdown messages are held
on top, Redis is SIGKILLed, without and then with AOF, and the run goes on with no one's help.
"""

from __future__ import annotations

import time

from apps.core.queues import Queue, TaskName
from apps.flows.runs import run_start
from apps.research.choices import NodeKind
from apps.research.models import AgentLoop
from rsiweb.celery import app as celery_app
from tests.factories import make_run
from tests.workers.agents.stack import wait_for

HELD = 3  # countdown messages the worker holds unacknowledged at each crash


def _hold(workers, tag: str) -> None:
    """Messages the agents worker takes and holds for ten minutes (a step of no loop: a no-op)."""
    ids = [
        celery_app.send_task(TaskName.AGENT_STEP, kwargs={"loop_id": -1, "step": i}, queue=Queue.AGENTS,
                             countdown=600).id
        for i in range(HELD)
    ]  # fmt: skip
    wait_for(lambda: all(f"[{task_id}]" in workers.log(Queue.AGENTS) for task_id in ids), timeout=30,
             what=f"{tag}: the agents worker to take the countdown messages", stack=workers.stack)  # fmt: skip


def test_a_redis_crash_while_the_agents_worker_holds_messages_does_not_stop_the_run(project, redis_server):
    workers = project("web", Queue.AGENTS, RSI_AGENT_LOST_AFTER_SECONDS="3")
    run = run_start(run=make_run())
    main = AgentLoop.objects.get(run=run, node__kind=NodeKind.MAIN)
    wait_for(lambda: AgentLoop.objects.get(pk=main.pk).supervisor_tick >= 2, timeout=60,
             what="the run's supervisor to tick", stack=workers.stack)  # fmt: skip
    agents = workers.process(Queue.AGENTS)

    for persistence in (False, True):
        tag = "with AOF" if persistence else "without AOF"
        if persistence:
            redis_server.appendonly = True
            redis_server.restart()
        _hold(workers, tag)
        crashes = workers.log(Queue.AGENTS).count("Connection to broker lost")
        redis_server.kill()
        time.sleep(1)
        redis_server.start()
        wait_for(lambda c=crashes: workers.log(Queue.AGENTS).count("Connection to broker lost") > c, timeout=30,
                 what=f"{tag}: the worker to notice the crash", stack=workers.stack)  # fmt: skip
        # The run goes on: its supervisor ticks again (each tick a message sent after the crash,
        # taken and run by the same worker process).
        ticked = AgentLoop.objects.get(pk=main.pk).supervisor_tick
        wait_for(lambda t=ticked: AgentLoop.objects.get(pk=main.pk).supervisor_tick > t + 2, timeout=60,
                 what=f"{tag}: the supervisor to tick after the crash", stack=workers.stack)  # fmt: skip
        assert agents.poll() is None, f"{tag}: the agents worker exited:\n{workers.log(Queue.AGENTS)[-4000:]}"
        assert workers.process(Queue.AGENTS) is agents

    log = workers.log(Queue.AGENTS)
    assert "Restoring" in log  # it did hold unacknowledged messages when Redis went
    assert "Unrecoverable error" not in log, log[-4000:]
    assert "has no attribute 'hostname'" not in log
    assert AgentLoop.objects.get(pk=main.pk).step >= 1  # the Main Agent stepped
