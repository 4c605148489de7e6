"""Every process killed mid-run (web, gpu, agents, default), then started again: the run continues
from the database with no duplicated Workers, jobs or events."""

from __future__ import annotations

from collections import Counter

import pytest

from apps.experiments.events import chain_verify
from apps.experiments.models import Event, Experiment
from apps.flows.runs import run_launch
from apps.jobs.models import Job
from apps.research.choices import RunStatus
from apps.research.models import AgentLoop, ResearchNode, Run
from tests.workers.agents.stack import run_status, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_stack_killed_mid_run_resumes_from_the_database(installed):
    stack = installed
    run = run_launch(benchmark="minibench/arithmetic", policy="heuristic", name="agents: restart run",
                     wall_seconds=3600, accelerator_seconds=3600, parallel=2, max_workers=2, reviewer=False,
                     screen_steps=30, train_steps=60, actor="test")  # fmt: skip
    # Kill while a training job runs and agent steps are in flight.
    wait_for(lambda: Job.objects.filter(run=run, kind="train", status="running", progress__gt=0).exists(),
             timeout=600, what="a training job under way", stack=stack)  # fmt: skip
    before = {
        "workers": ResearchNode.objects.filter(run=run, kind="worker").count(),
        "experiments": Experiment.objects.filter(run=run).count(),
    }
    stack.kill()
    interrupted = list(Job.objects.filter(run=run, status="running").values_list("pk", flat=True))
    assert interrupted  # the killed worker left its job running, as a crash would
    stack.start()
    stack.wait_ready()

    wait_for(lambda: run_status(run) in (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.STOPPED),
             timeout=1800, what="the restarted run to finish", stack=stack, every=3)  # fmt: skip
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.FINISHED, list(run.status_changes.values_list("to_status", "reason"))

    # Nothing was lost: the work from before the crash is still there, and the run went past it.
    assert ResearchNode.objects.filter(run=run, kind="worker").count() >= before["workers"]
    assert Experiment.objects.filter(run=run).count() >= before["experiments"]
    # The interrupted job was declared lost and re-run as attempt 2 — once.
    for pk in interrupted:
        job = Job.objects.get(pk=pk)
        assert job.status == "lost"
        assert Job.objects.filter(previous_attempt=job).count() == 1

    # No duplicated Workers: every Worker was created by exactly one state_add_new_worker call that
    # was not a replay, and the Main Agent never asked for more than its plan allows.
    created = Event.objects.filter(run=run, type="tool.called", tool="state_add_new_worker")
    fresh = [e for e in created if e.arguments.get("status") == 201 and not e.arguments.get("replayed")]
    workers = ResearchNode.objects.filter(run=run, kind="worker")
    assert len(fresh) == workers.count()
    assert sorted(e.result_ref for e in fresh) == sorted(f"node:{w.uuid}" for w in workers)
    assert workers.count() <= 2
    # No duplicated jobs: one job per (experiment, kind, attempt); attempts chain without forks.
    jobs = Job.objects.filter(run=run)
    keys = Counter(jobs.exclude(kind="final_eval").values_list("experiment_id", "kind", "attempt"))
    assert max(keys.values()) == 1
    finals = Counter(jobs.filter(kind="final_eval").values_list("spec__checkpoint", flat=True))
    assert max(finals.values()) == 1  # each checkpoint evaluated on the final split once
    # No duplicated experiments: each Worker submission key was used once.
    submissions = Counter(Experiment.objects.filter(run=run).values_list("owner_id", "idempotency_key"))
    assert max(submissions.values()) == 1
    # No duplicated events: one node.created per node, one final result; the chain verifies.
    created_nodes = Counter(Event.objects.filter(run=run, type="node.created").values_list("result_ref", flat=True))
    assert max(created_nodes.values()) == 1
    assert Event.objects.filter(run=run, type="run.final_result").count() == 1
    assert Event.objects.filter(run=run, type="run.final_eval_started").count() == 1
    assert chain_verify(str(run.uuid)).ok
    assert not AgentLoop.objects.filter(run=run, status__in=("scheduled", "running", "waiting")).exists()
