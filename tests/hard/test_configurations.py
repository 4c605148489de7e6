"""One short run of each ablation configuration on the hard profile's smallest build, at once.

Completion, not efficacy: the ablation's numbers come from bench/ablation.py. The three runs are
the ablation suite bench/ablation.py and the comparison page's button create (apps.dojo.suites,
``ABLATION_AGENTS``, one seed), all three at once on one stack, each with the same budget; the
suite's clock (the agents worker) finishes the suite, and the ablation grouping sees its three arms.
"""

from __future__ import annotations

import time

import pytest

from apps.benchmarks.minibench.hard.build import SUGGESTED_BUDGET
from apps.dojo.agents import ABLATION_AGENTS
from apps.dojo.models import AgentSuite
from apps.dojo.suites import suite_create, suite_launch
from apps.experiments.models import Event
from apps.flows.compare import ablation_groups, best_so_far
from apps.flows.runs import run_final_result
from apps.jobs.choices import JobKind
from apps.jobs.models import Job
from apps.research.choices import RunStatus
from apps.research.models import ResearchNode, Run
from apps.research.selectors import run_ablation
from apps.reviews.models import ReviewReport
from tests.workers.agents.stack import wait_for

# The django_db mark makes pytest-django create the test database for this session (it sets up
# only the databases its collected tests are marked for); each test reads the committed runs.
pytestmark = [pytest.mark.slow, pytest.mark.django_db]

# Each run's budget: two Workers of 10-step trainings, so the Main Agent spends it in a few
# branches; the wait covers all three at once and the final evaluations (docs/benchmarks.md).
# The schedule is the profile's suggested one (a constant rate: the fair version, issue 32 item 4).
BUDGET = {"wall_seconds": 15 * 60, "accelerator_seconds": 400, "parallel": 2, "max_workers": 2, "screen_steps": 5,
          "train_steps": 10, "batch_size": 16, "lr_scheduler_type": SUGGESTED_BUDGET["lr_scheduler_type"]}  # fmt: skip
TIMEOUT = 25 * 60


@pytest.fixture(scope="module")
def runs(hard_stack) -> dict[str, Run]:
    with hard_stack.django_db_blocker.unblock():
        started = time.monotonic()
        suite = suite_create(name="hard ci", agents=list(ABLATION_AGENTS), tasks=["minibench-hard/arithmetic"],
                             base_models=["minibench-hard/theta0"], budget=BUDGET, seeds=[0], max_concurrent=3,
                             actor="test")  # fmt: skip
        suite_launch(suite=suite, actor="test")
        wait_for(lambda: AgentSuite.objects.get(pk=suite.pk).status == "finished", timeout=TIMEOUT,
                 what="the ablation suite to finish", stack=hard_stack, every=3)  # fmt: skip
        print(f"three hard-profile runs ended in {time.monotonic() - started:.0f} s")  # noqa: T201
        runs = [c.run for c in suite.cells.select_related("run").order_by("position")]
        yield {run_ablation(run): Run.objects.get(pk=run.pk) for run in runs}


@pytest.fixture
def committed(runs, hard_stack):
    with hard_stack.django_db_blocker.unblock():
        yield runs


def test_each_configuration_finishes_with_a_final_result(committed):
    for name, run in committed.items():
        assert run.status == RunStatus.FINISHED, (name, list(run.status_changes.values_list("to_status", "reason")))
        result = run_final_result(run=run)
        assert result is not None, name
        assert result["theta0"]["final_score"] is not None
        assert best_so_far(run), f"{name}: no accepted feedback score"


def test_every_training_job_of_every_arm_ran_at_the_suites_schedule(committed):
    for name, run in committed.items():
        schedules = [job.spec["hyperparameters"].get("lr_scheduler_type")
                     for job in Job.objects.filter(run=run, kind=JobKind.TRAIN)]  # fmt: skip
        assert schedules, f"{name}: no training job"
        assert set(schedules) == {"constant"}, (name, schedules)


def test_the_switches_change_who_runs(committed):
    reviewers = {name: ResearchNode.objects.filter(run=run, kind="reviewer").count() for name, run in committed.items()}
    assert reviewers["no-reviewer"] == 0
    assert reviewers["full"] >= 1
    assert reviewers["serial-workers"] >= 1
    workers = list(ResearchNode.objects.filter(run=committed["serial-workers"], kind="worker").order_by("pk"))
    assert len(workers) >= 2
    overlapping = [(a.handle, b.handle) for i, a in enumerate(workers) for b in workers[i + 1 :]
                   if a.finalized_at and b.finalized_at and a.created_at < b.finalized_at
                   and b.created_at < a.finalized_at]  # fmt: skip
    assert not overlapping


def test_reviewers_read_per_sample_outputs_and_report_to_the_main_agent(committed):
    run = committed["full"]
    calls = Event.objects.filter(run=run, type="tool.called", tool="compare_eval_samples")
    assert calls.exists()
    assert all(e.actor.startswith("reviewer_") for e in calls)
    assert ReviewReport.objects.filter(run=run).exists()
    assert Event.objects.filter(run=run, type="tool.called", tool="inspect_reviewer_report").exists()
    # Workers never hold per-sample outputs.
    for other in committed.values():
        assert not Event.objects.filter(run=other, type="tool.called", tool="compare_eval_samples",
                                        actor__startswith="worker_").exists()  # fmt: skip


def test_the_ablation_view_groups_the_three_runs_as_its_arms(committed):
    groups = ablation_groups(list(committed.values()))
    assert len(groups) == 1
    arms = {arm["name"]: arm for arm in groups[0]["arms"]}
    assert set(arms) == {"full", "serial-workers", "no-reviewer"}
    assert all(arm["n_scored"] == 1 for arm in arms.values())
