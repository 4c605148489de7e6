"""Agent loops stepped in this process against the real REST API (live server, real PostgreSQL).

This module sorts before the end-to-end ones on purpose: no stack is running yet, so no other
process consumes the steps these tests enqueue.

Celery is not running here: each test plays the agents worker by calling ``agent_step_run`` for
the loops that are scheduled, exactly as ``agent_step_task`` would. Nothing trains (no gpu worker),
so Workers stop at waiting for their first jobs.
"""

from __future__ import annotations

import base64
import json

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User

from apps.core.queues import TaskName
from apps.datapool.models import DataUsage
from apps.experiments.models import Event, Experiment
from apps.flows.runs import run_budget_enforce, run_pause, run_resume, run_start, run_stop
from apps.flows.supervisor import run_supervise
from apps.integrity.models import BlockedAttempt
from apps.jobs.models import Job
from apps.research.agent_config import loop_config, prompt_hashes
from apps.research.agent_loops import agent_loop_claim, agent_loops_recover
from apps.research.choices import AgentLoopStatus, NodeStatus, RunStatus
from apps.research.models import AgentLoop, Decision, Guidance, LLMUsage, Prediction, ResearchNode, Run
from apps.research.services import guidance_post
from tests.fakes.openai_chat import FakeChatServer, Reply, Script
from workers.agents.client import ExposClient
from workers.agents.loop import agent_step_run, api_base_url, node_token, step_view, worker_name

pytestmark = pytest.mark.django_db(transaction=True)


def step(loop: AgentLoop) -> AgentLoop:
    agent_step_run(loop_id=loop.pk, step=loop.step)
    return AgentLoop.objects.select_related("node").get(pk=loop.pk)


def step_until(world, handle: str, *, until: str | None = None, limit: int = 12) -> AgentLoop:
    """Step one loop while it is scheduled (ignoring countdowns: this test is its clock)."""
    loop = world.loop(handle)
    for _ in range(limit):
        if loop.status != AgentLoopStatus.SCHEDULED:
            break
        if until is not None and (loop.state or {}).get("phase") == until:
            break
        loop = step(loop)
    return loop


def started(world):
    run_start(run=world.run, actor="test")
    main = world.loop("main")
    assert main.status == AgentLoopStatus.SCHEDULED
    assert [i["trigger"] for i in main.inbox] == ["run_start"]
    return step(main)


def test_run_start_records_prompt_hashes_and_the_main_agent_plans_diverse_workers(small_world):
    main = started(small_world)
    run = small_world.refresh()
    assert run.status == RunStatus.RUNNING
    assert run.started_at is not None
    assert run.prompt_hashes["policy"] == "heuristic"
    assert run.prompt_hashes["main"] == prompt_hashes()["main"]
    assert len(run.prompt_hashes["worker"]["sha256"]) == 64
    # Event-driven: after its planning step the Main Agent waits for the next trigger.
    assert main.status == AgentLoopStatus.WAITING
    assert main.step == 1
    assert main.inbox == []
    assert main.journal == []
    decision = Decision.objects.get(run=run)
    assert (decision.kind, decision.trigger) == ("branch", "run_start")
    workers = list(ResearchNode.objects.filter(run=run, kind="worker").order_by("pk"))
    assert [w.task.splitlines()[0] for w in workers] == ["Direction: data-screen", "Direction: recipe-sweep"]
    assert all(w.created_by_decision_id == decision.pk and w.status == NodeStatus.ACTIVE for w in workers)
    assert Prediction.objects.filter(run=run, worker__in=workers).count() == 2
    # Pending guidance is read first at every planning step.
    calls = list(Event.objects.filter(run=run, actor="main", type="tool.called").order_by("id")
                 .values_list("tool", flat=True))  # fmt: skip
    assert calls[0] == "main_guidance_read"
    # The spawned Workers got their loops, and their first steps are scheduled.
    assert {loop.node.handle: loop.status for loop in AgentLoop.objects.filter(run=run).exclude(node=main.node)} == {
        "worker_0001": AgentLoopStatus.SCHEDULED, "worker_0002": AgentLoopStatus.SCHEDULED}  # fmt: skip


def test_the_data_screen_worker_searches_inspects_registers_and_submits_and_the_honeypot_is_blocked(small_world):
    started(small_world)
    loop = step_until(small_world, "worker_0001")
    state = loop.state
    assert loop.status == AgentLoopStatus.SCHEDULED
    assert state["phase"] == "wait"
    ranked = [c["name"] for c in state["candidates"]]
    assert ranked[0] == "arithmetic-clean"
    assert {c["name"]: c["score"] for c in state["candidates"]}["arithmetic-wrongformat"] <= -2
    assert set(state["data"]) == {"arithmetic-clean", "arithmetic-honeypot", "arithmetic-tiny"}
    # The honeypot was tried, refused by the submission review, and counted as a blocked attempt.
    assert [b["datasets"] for b in state["blocked"]] == [["arithmetic-honeypot"]]
    assert BlockedAttempt.objects.filter(run=small_world.run, node__handle="worker_0001").exists()
    experiments = Experiment.objects.filter(owner=loop.node).order_by("pk")
    # Two in flight at a time: clean and tiny; the refused honeypot does not take a slot.
    assert [e.kind for e in experiments] == ["train_eval", "train_eval"]
    assert experiments[0].action["hyperparameters"]["learning_rate"] == 0.002
    assert experiments[0].action["hyperparameters"]["max_steps"] == 5  # the run's screening length
    assert Job.objects.filter(experiment__in=experiments).count() == 2
    assert not DataUsage.objects.filter(entry__name="arithmetic-honeypot").exists()


def test_guidance_is_applied_at_the_next_planning_step_with_a_checkable_effect(small_world):
    started(small_world)
    step_until(small_world, "worker_0001", until="plan")  # it registered data, submitted nothing yet
    person = User.objects.create_user("olga", password="pw-olga-123")
    guidance = guidance_post(run=small_world.run, author=person, text="Please avoid arithmetic-tiny from now on.")
    main = small_world.loop("main")
    assert main.status == AgentLoopStatus.SCHEDULED
    assert main.inbox[0]["trigger"] == "guidance"
    main = step(main)
    guidance.refresh_from_db()
    decision = guidance.applied_decision
    assert guidance.applied_at is not None
    assert decision is not None
    assert (decision.kind, decision.trigger) == ("revise", "guidance")
    assert "avoid arithmetic-tiny" in decision.rationale
    # Its effect: the Workers briefed without the constraint were stopped, and replaced by Workers
    # that carry it, created by the decision that applied the guidance.
    stopped = ResearchNode.objects.filter(run=small_world.run, handle__in=["worker_0001", "worker_0002"])
    assert {n.status for n in stopped} == {NodeStatus.FINALIZED}
    replacements = list(ResearchNode.objects.filter(run=small_world.run, created_by_decision=decision).order_by("pk"))
    assert len(replacements) == 2
    assert all("avoid: arithmetic-tiny" in n.task for n in replacements)
    assert all(n.upstream_edges.filter(kind="context").exists() for n in replacements)
    # The stopped Worker's loop ends at its next step; the replacement never uses the dataset.
    assert step(small_world.loop("worker_0001")).status == AgentLoopStatus.DONE
    loop = step_until(small_world, replacements[0].handle)
    assert "arithmetic-tiny" not in loop.state["data"]
    later = Experiment.objects.filter(run=small_world.run, created_at__gt=decision.created_at)
    assert later.exists()
    assert not DataUsage.objects.filter(experiment__in=later, entry__name="arithmetic-tiny").exists()


def test_a_re_run_step_is_answered_once_from_the_journal_or_by_its_idempotency_key(small_world):
    run = run_start(run=small_world.run, actor="test")
    loop = small_world.loop("main")
    config = loop_config()
    claim = worker_name()
    assert agent_loop_claim(loop_id=loop.pk, step=None, claim=claim)  # the step task's claim, run here
    loop.refresh_from_db()
    body = {"task": "Direction: data-screen\nCapability: arithmetic"}
    client = ExposClient(base_url=api_base_url(), token=node_token(loop.node))
    first = step_view(loop, run, claim, config, client).call("state_add_new_worker", body)
    assert first.status == 201
    assert len(AgentLoop.objects.get(pk=loop.pk).journal) == 1  # written before anything else happens

    # The process dies here. Recovery re-schedules the step with its journal intact ...
    assert agent_loops_recover(run=run, dead_claims={claim.rsplit(":", 1)[0] + ":"}) == 1
    loop = AgentLoop.objects.select_related("node").get(pk=loop.pk)
    assert loop.status == AgentLoopStatus.SCHEDULED
    assert len(loop.journal) == 1
    assert agent_loop_claim(loop_id=loop.pk, step=None, claim=claim)
    replay = step_view(loop, run, claim, config, client).call("state_add_new_worker", body)
    assert replay.data == first.data  # ... and the re-run reads the answer from the journal, not the server

    # Had it died before the journal was written, the re-sent call carries the same key: answered once.
    lost = step_view(loop, run, claim, config, client)
    lost._journal.clear()
    resent = lost.call("state_add_new_worker", body)
    assert resent.replayed
    assert resent.status == 200
    assert resent.data["handle"] == first.data["handle"]
    assert ResearchNode.objects.filter(run=run, kind="worker").count() == 1
    sent = Event.objects.filter(run=run, type="tool.called", tool="state_add_new_worker")
    assert sent.count() == 2  # the original and the replayed answer; the journal replay sent nothing
    client.close()


def test_a_spent_budget_stops_new_work(small_world):
    started(small_world)
    step_until(small_world, "worker_0001")  # two submissions queued on the (idle) gpu queue
    queued_train = Job.objects.filter(run=small_world.run, kind="train", status="queued")
    assert queued_train.exists()
    run = small_world.refresh()
    Run.objects.filter(pk=run.pk).update(used_accelerator_seconds=run.budget_accelerator_seconds)
    run = run_budget_enforce(run=run)
    assert run.status == RunStatus.STOPPING
    assert not Job.objects.filter(run=run, kind="train", status="queued").exists()  # never started
    assert Event.objects.filter(run=run, type="run.budget_exhausted").exists()
    # The Worker sees the run stopping: no new submission, it finalizes with what it has.
    before = Experiment.objects.filter(run=run).count()
    loop = step_until(small_world, "worker_0002")
    assert loop.status == AgentLoopStatus.DONE
    assert Experiment.objects.filter(run=run).count() == before
    assert ResearchNode.objects.get(run=run, handle="worker_0002").status == NodeStatus.FINALIZED
    # The Main Agent cannot open new branches either.
    client = ExposClient(base_url=api_base_url(), token=node_token(small_world.main))
    refused = client.call("state_add_new_worker", {"task": "Direction: verify"}, idempotency_key="k-budget")
    assert refused.status == 409
    assert refused.error_code == "run_not_active"
    client.close()
    assert not Guidance.objects.exists()


def _queued_steps() -> list[dict]:
    """The agent-step messages waiting on the agents queue (kombu's Redis list), as (loop_id, step)."""
    messages = redis.Redis.from_url(settings.CELERY_BROKER_URL).lrange("agents", 0, -1)
    steps = []
    for raw in messages:
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        if message["headers"].get("task") == TaskName.AGENT_STEP:
            steps.append(body[1])
    return steps


def test_pause_holds_every_step_and_resume_sends_them_again(small_world):
    started(small_world)
    loop = small_world.loop("worker_0001")
    paused = run_pause(run=small_world.run, actor="user:olga", reason="looking at the data")
    assert paused.status == RunStatus.PAUSED
    assert step(loop).step == 0  # not claimed: nothing happens while paused
    assert small_world.loop("worker_0001").status == AgentLoopStatus.SCHEDULED

    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("agents")
    resumed = run_resume(run=small_world.run, actor="user:olga")
    assert resumed.status == RunStatus.RUNNING
    assert {"loop_id": loop.pk, "step": 0} in _queued_steps()
    assert step(small_world.loop("worker_0001")).step == 1
    # An operator's abort: active jobs cancelled, every loop ended, no result.
    step_until(small_world, "worker_0001")
    assert Job.objects.filter(run=small_world.run, status="queued").exists()
    stopped = run_stop(run=small_world.run, actor="user:olga", reason="wrong benchmark", final_eval=False)
    assert stopped.status == RunStatus.STOPPED
    assert not Job.objects.filter(run=stopped, status__in=("queued", "running")).exists()
    assert not AgentLoop.objects.filter(run=stopped, status__in=("scheduled", "running", "waiting")).exists()


def test_training_held_at_the_gate_wakes_the_main_agent_which_approves_it(small_world):
    Run.objects.filter(pk=small_world.run.pk).update(policy={**small_world.run.policy, "training_gate": True})
    started(small_world)
    step_until(small_world, "worker_0001")
    held = Experiment.objects.filter(run=small_world.run, status="held")
    assert held.count() == 2
    assert not Job.objects.filter(experiment__in=held).exists()
    # Each held submission woke the Main Agent itself, in the submission's transaction: no clock.
    main = small_world.loop("main")
    gate_items = [i for i in main.inbox if i["trigger"] == "training_gate"]
    assert sorted(i["experiment"] for i in gate_items) == sorted(held.values_list("handle", flat=True))
    assert (
        Event.objects.filter(run=small_world.run, type="main.triggered", arguments__trigger="training_gate").count()
        == 2
    )
    # A supervisor tick adds nothing: one wake-up per request.
    run_supervise(run_id=small_world.run.pk, tick=main.supervisor_tick)
    assert len([i for i in small_world.loop("main").inbox if i["trigger"] == "training_gate"]) == 2
    step(small_world.loop("main"))
    assert not Experiment.objects.filter(run=small_world.run, status="held").exists()
    assert Job.objects.filter(run=small_world.run, kind="train").count() == 2
    decided = Event.objects.filter(run=small_world.run, type="training.decided")
    assert {e.arguments["decision"] for e in decided} == {"approve"}


def test_the_llm_token_budget_stops_the_run(small_world, monkeypatch):
    """An LLM run whose token budget is spent stops: the agent makes no further model call."""
    calls = Script({"main": [Reply(tool_calls=[("main_guidance_read", {})]), Reply(tool_calls=[
        ("public_check_quota", {})])]})  # fmt: skip
    with FakeChatServer(calls) as fake:
        monkeypatch.setenv("RSI_LLM_BASE_URL", fake.base_url)
        monkeypatch.setenv("RSI_LLM_MODEL", "fake-tool-model")
        Run.objects.filter(pk=small_world.run.pk).update(agent_mode="llm", budget_llm_tokens=200)
        run = run_start(run=Run.objects.get(pk=small_world.run.pk), actor="test")
        loop = small_world.loop("main")
        agent_step_run(loop_id=loop.pk, step=loop.step)
        run = Run.objects.get(pk=run.pk)
        assert run.used_llm_tokens > 200  # one call spent the budget (the prompt alone is larger)
        assert LLMUsage.objects.filter(run=run, node__handle="main").count() == 1
        loop = small_world.loop("main")
        assert loop.status == AgentLoopStatus.SCHEDULED  # it called a tool, so it would go on ...
        agent_step_run(loop_id=loop.pk, step=loop.step)
        run = Run.objects.get(pk=run.pk)
        assert run.status == RunStatus.STOPPING  # ... but the spent budget stopped the run
        assert len(fake.requests) == 1  # and no second model call was made
        assert small_world.loop("main").status == AgentLoopStatus.DONE
