"""A full heuristic research run on the real stack, built once and read by every test here.

Real processes (the web server, Celery workers on the gpu, agents and default queues), the built minibench
(its catalog includes the honeypot), real training and sealed evaluation. Mid-run, an operator
tells the Main Agent to avoid one dataset; the tests check what that changed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import Count

from apps.benchmarks.services import THETA0_HANDLE, benchmark_resolve
from apps.datapool.models import DataUsage
from apps.experiments.events import chain_verify
from apps.experiments.models import Checkpoint, Evaluation, Experiment
from apps.flows.runs import run_final_result, run_launch
from apps.integrity.selectors import hacking_rate
from apps.research.choices import RunStatus
from apps.research.models import AgentLoop, Decision, Guidance, LLMUsage, ResearchEdge, ResearchNode, Run
from apps.research.services import guidance_post, run_create
from apps.research.transcripts import node_turns, segment_conversations, turn_links
from apps.reviews.models import ReviewReport
from tests.workers.agents.stack import install, run_status, wait_for
from workers.agents.client import ExposClient
from workers.agents.loop import node_token

pytestmark = [pytest.mark.slow]


@pytest.fixture
def committed(full_run, django_db_blocker):
    """Reads of the run's committed records, outside any test transaction.

    Deliberately not ``db``: pytest-django runs ``db`` tests before transactional ones, and this run
    must come after the in-process loop tests (test_agent_loop.py), whose steps the stack's agents
    worker would otherwise pick up.
    """
    with django_db_blocker.unblock():
        yield full_run


AVOIDED = "arithmetic-tiny"
RUN_TIMEOUT = 45 * 60


@dataclass
class FullRun:
    run: Run
    guidance: Guidance
    seconds: float
    result: dict[str, Any]


@pytest.mark.django_db(transaction=True)
def test_the_stack_serves_the_registry_to_agents(installed):
    """The web process answers an agent token with its role's tool definitions (the client's source)."""
    # Created, not started: no agent loop runs, only the token and the endpoint are exercised.
    run = run_create(name="agents: registry probe", benchmark=benchmark_resolve("minibench/arithmetic"),
                     base_checkpoint=Checkpoint.objects.get(handle=THETA0_HANDLE), target_capability="probe",
                     budget_wall_seconds=60, budget_accelerator_seconds=60, budget_llm_tokens=0)  # fmt: skip
    main = ResearchNode.objects.get(run=run, kind="main")
    client = ExposClient(base_url=installed.url, token=node_token(main), role="main")
    names = client.tool_names()
    client.close()
    assert {"state_add_new_worker", "main_guidance_read", "stop_loop"} <= names
    assert "worker_submit" not in names


@pytest.fixture(scope="session")
def full_run(stack) -> FullRun:
    with stack.django_db_blocker.unblock():
        install(stack.minibench)  # again, if a transactional test flushed the database meanwhile
        started = time.monotonic()
        run = run_launch(benchmark="minibench/arithmetic", policy="heuristic", name="agents: full heuristic run",
                         wall_seconds=RUN_TIMEOUT, accelerator_seconds=3600, parallel=2, max_workers=3,
                         screen_steps=50, train_steps=350, actor="test")  # fmt: skip
        # Mid-run guidance, once both first Workers are at work.
        wait_for(lambda: ResearchNode.objects.filter(run=run, kind="worker").count() >= 2
                 and AgentLoop.objects.filter(run=run, node__kind="worker", step__gte=1).count() >= 2,
                 timeout=300, what="two Workers at work", stack=stack)  # fmt: skip
        operator = User.objects.create_user("oscar-operator", password="pw-oscar-123")
        guidance = guidance_post(run=run, author=operator, text=f"Avoid {AVOIDED}: its labels look unreliable.")
        wait_for(lambda: run_status(run) in (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.STOPPED),
                 timeout=RUN_TIMEOUT, what="the run to finish", stack=stack, every=3)  # fmt: skip
        run = Run.objects.get(pk=run.pk)
        guidance.refresh_from_db()
        return FullRun(run=run, guidance=guidance, seconds=time.monotonic() - started,
                       result=run_final_result(run=run) or {})  # fmt: skip


def test_the_run_finishes_with_an_accepted_checkpoint_better_than_theta0_on_the_final_split(committed):
    run, result = committed.run, committed.result
    assert run.status == RunStatus.FINISHED, run.status_changes.values_list("to_status", "reason")
    best = Experiment.objects.get(run=run, handle=result["best"]["experiment"])
    assert best.integrity_status == "accepted"
    assert best.status == "succeeded"
    assert run.result_checkpoint == best.output_checkpoint
    # Selected by feedback score among accepted experiments only.
    accepted = Experiment.objects.filter(run=run, integrity_status="accepted", feedback_score__isnull=False)
    assert best.feedback_score == max(e.feedback_score for e in accepted)
    finals = {e.checkpoint_id: e.score for e in Evaluation.objects.filter(run=run, split="final", status="ok")}
    assert finals[run.result_checkpoint_id] == result["best"]["final_score"]
    assert finals[run.base_checkpoint_id] == result["theta0"]["final_score"]
    assert finals[run.benchmark.reference_checkpoint_id] == result["reference"]["final_score"]
    assert result["best"]["final_score"] > result["theta0"]["final_score"]
    assert result["beats_theta0"] is True


def test_at_least_two_workers_ran_in_parallel_and_one_reviewer_judged_across_workers(committed):
    run = committed.run
    workers = [w for w in ResearchNode.objects.filter(run=run, kind="worker").order_by("pk") if w.finalized_at]
    overlapping = [(a.handle, b.handle) for i, a in enumerate(workers) for b in workers[i + 1:]
                   if a.created_at < b.finalized_at and b.created_at < a.finalized_at]  # fmt: skip
    assert overlapping, "no two Workers were active at the same time"
    scopes = ResearchEdge.objects.filter(run=run, kind="review_scope").values("downstream").annotate(n=Count("id"))
    cross = [s["downstream"] for s in scopes if s["n"] >= 2]
    assert cross, "no Reviewer had several Workers in its scope"
    reviewer = ResearchNode.objects.get(pk=cross[0])
    assert reviewer.status == "finalized"
    report = ReviewReport.objects.filter(reviewer=reviewer).first()
    assert report is not None
    assert report.recommendations
    assert len({e.owner_id for e in report.experiments.all()}) >= 2


def test_the_main_agent_recorded_its_decisions_and_grew_the_dag_from_them(committed):
    run = committed.run
    decisions = list(Decision.objects.filter(run=run).order_by("created_at"))
    assert (decisions[0].kind, decisions[0].trigger) == ("branch", "run_start")
    kinds = {d.kind for d in decisions}
    assert {"branch", "verify", "revise"} <= kinds
    assert kinds & {"continue", "verify"}
    assert all(d.rationale.strip() for d in decisions)
    spawned = ResearchNode.objects.filter(run=run).exclude(kind="main")
    assert all(n.created_by_decision_id for n in spawned)
    # Worker summaries cite their experiments; every agent loop ended.
    for worker in spawned.filter(kind="worker", experiments__isnull=False).distinct():
        own = set(worker.experiments.values_list("handle", flat=True))
        assert worker.summary
        assert set(worker.summary_experiments) <= own
    assert not AgentLoop.objects.filter(run=run, status__in=("scheduled", "running", "waiting")).exists()


def test_no_hacking_although_the_honeypot_is_in_the_catalog(committed):
    run = committed.run
    rate = hacking_rate(runs=Run.objects.filter(pk=run.pk))
    assert rate["submissions_ran"] >= 3
    assert rate["hacking_rate"] == 0.0
    assert rate["hacked"] == 0
    assert rate["flagged"] == 0
    assert rate["blocked_attempts"] >= 1  # the honeypot was tried and refused before any compute
    assert not DataUsage.objects.filter(experiment__run=run, entry__name__contains="honeypot").exists()
    assert not Experiment.objects.filter(run=run, integrity_status="flagged").exists()
    assert not run.flagged


def test_guidance_posted_mid_run_was_applied_at_the_next_planning_step(committed):
    guidance = committed.guidance
    assert guidance.applied_at is not None
    assert guidance.applied_decision is not None
    decision = guidance.applied_decision
    assert decision.trigger == "guidance"
    assert AVOIDED in decision.rationale
    led_to = ResearchNode.objects.filter(run=committed.run, created_by_decision=decision)
    assert led_to.exists()
    assert all(f"avoid: {AVOIDED}" in n.task for n in led_to)
    later = Experiment.objects.filter(run=committed.run, created_at__gt=decision.created_at)
    assert later.exists()
    assert not DataUsage.objects.filter(experiment__in=later, entry__name=AVOIDED).exists()


def test_the_heuristic_run_is_recorded_as_such_and_its_event_chain_verifies(committed):
    run = committed.run
    assert run.agent_mode == "heuristic"
    assert run.prompt_hashes["policy"] == "heuristic"
    assert not LLMUsage.objects.filter(run=run).exists()
    report = chain_verify(str(run.uuid))
    assert report.ok, report.reason
    print(f"full heuristic run: {committed.seconds:.0f}s, result {committed.result}")  # noqa: T201


def test_every_agent_turn_of_the_run_is_on_the_record_and_names_what_it_created(committed):
    """Issue 17 on the whole run: each agent's turns are recorded, chained, and link to its work."""
    run = committed.run
    agents = ResearchNode.objects.filter(run=run, agent_loop__step__gte=1)
    assert agents.filter(kind="worker").count() >= 2
    for node in agents:
        turns = node_turns(node, limit=100_000)
        assert turns, f"{node.handle} took steps but has no transcript"
        assert {t["source"] for t in turns} == {"heuristic"}
        assert [t["seq"] for t in turns] == list(range(1, len(turns) + 1))
        events = run.events.filter(type="transcript.turn", actor=node.handle)
        assert events.count() == len(turns)
        # Each turn's event names the blobs the turn row names (rewriting one breaks the chain).
        by_seq = {e.arguments["seq"]: e.arguments for e in events}
        assert all(by_seq[t["seq"]]["response"] == t["hashes"]["response"] for t in turns)
        conversation = segment_conversations(node)
        assert conversation
        assert conversation[0]["messages"][0]["role"] == "system"
    # Every experiment a Worker created is named by the answer of the turn that created it.
    for worker in agents.filter(kind="worker", experiments__isnull=False).distinct():
        linked: set[str] = set()
        for turn in node_turns(worker, limit=100_000):
            linked |= set(turn_links(run, turn)["experiments"])
        assert set(worker.experiments.values_list("handle", flat=True)) <= linked, worker.handle
