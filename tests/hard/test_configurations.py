"""One short run of each ablation configuration on the hard profile's smallest build, at once.

Completion, not efficacy: the ablation's numbers come from bench/ablation.py. The three runs share
one stack and one budget each, and the dashboard's ablation grouping sees them as its three arms.
"""

from __future__ import annotations

import time

import pytest

from apps.experiments.models import Checkpoint, Event
from apps.research.choices import RunStatus
from apps.research.compare import ablation_groups, best_so_far
from apps.research.models import ResearchNode, Run
from apps.research.services import run_final_result, run_launch
from apps.reviews.models import ReviewReport
from tests.workers.agents.stack import run_status, wait_for

pytestmark = [pytest.mark.slow]

CONFIGS = {
    "full": {"reviewer": True, "serial_workers": False},
    "serial-workers": {"reviewer": True, "serial_workers": True},
    "no-reviewer": {"reviewer": False, "serial_workers": False},
}
# Wall budget of each run, and how long the test waits for all three (they end with a final
# evaluation after the budget). Measured on the shared dev VM at load 10-19: the three runs reached
# their 15-minute wall budget before the Main Agents stopped them (docs/benchmarks.md).
WALL = 20 * 60
TIMEOUT = 40 * 60
ENDED = (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.STOPPED)


@pytest.fixture(scope="module")
def runs(hard_stack) -> dict[str, Run]:
    with hard_stack.django_db_blocker.unblock():
        theta0 = Checkpoint.objects.get(handle="minibench-hard/theta0")
        started = time.monotonic()
        launched = {
            name: run_launch(benchmark="minibench-hard/arithmetic", policy="heuristic", base_checkpoint=theta0,
                             name=f"hard ci: {name}", wall_seconds=WALL, accelerator_seconds=900, parallel=2,
                             max_workers=3, screen_steps=5, train_steps=10, batch_size=16, seed=0, actor="test",
                             **switches)
            for name, switches in CONFIGS.items()
        }  # fmt: skip
        for run in launched.values():
            wait_for(lambda r=run: run_status(r) in ENDED, timeout=TIMEOUT, what=f"{run.name} to end",
                     stack=hard_stack, every=3)  # fmt: skip
        print(f"three hard-profile runs ended in {time.monotonic() - started:.0f} s")  # noqa: T201
        yield {name: Run.objects.get(pk=run.pk) for name, run in launched.items()}


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
