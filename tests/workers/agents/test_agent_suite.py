"""An agent suite on the real stack: one task x two agent configurations on a small budget.

Real processes (web, gpu/agents/default Celery workers), the built ci minibench, real training and
sealed evaluation. The suite is created and launched through the services; the agents worker's
advance clock (``workers.agents.suite_advance_task``) finishes it once both runs have ended. The
statistics are then read from the runs' own records. Which agent wins at this budget is not
asserted (too few steps to be reliable); that the weakened switches took effect is, from the
recorded experiments: the weak agent trained every experiment with one recipe, and trained on a
catalog dataset the ranking sets aside (off-task), which the heuristic never did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from apps.core.queues import Queue, TaskName
from apps.datapool.models import DataEntry
from apps.dojo.models import AgentSuite
from apps.dojo.suite_stats import stats_csv, suite_stats
from apps.dojo.suites import suite_create, suite_launch
from apps.experiments.models import Experiment
from apps.research.choices import RUN_TERMINAL_STATES
from apps.research.models import Run
from rsiweb.celery import app
from tests.workers.agents.stack import install, wait_for
from workers.agents import tasks

pytestmark = [pytest.mark.slow]

SUITE_TIMEOUT = 15 * 60
BUDGET = {"wall_seconds": 900, "accelerator_seconds": 1800, "parallel": 2, "max_workers": 2, "reviewer": False,
          "screen_steps": 10, "train_steps": 20, "batch_size": 16}  # fmt: skip
OFF_TASK = "arithmetic-irrelevant"  # its card describes another skill: the ranking sets it aside


@dataclass
class SuiteRun:
    suite: AgentSuite
    stats: dict[str, Any]
    seconds: float
    runs: dict[str, Run]


@pytest.fixture(scope="module")
def suite_run(stack) -> SuiteRun:
    with stack.django_db_blocker.unblock():
        install(stack.minibench)
        started = time.monotonic()
        suite = suite_create(name="agents: suite of two", agents=["heuristic", "heuristic-weak"],
                             tasks=["minibench/arithmetic"], budget=BUDGET, max_concurrent=2, actor="test")  # fmt: skip
        suite = suite_launch(suite=suite, actor="test")
        wait_for(lambda: AgentSuite.objects.get(pk=suite.pk).status == "finished", timeout=SUITE_TIMEOUT,
                 what="the suite to finish", stack=stack, every=3)  # fmt: skip
        seconds = time.monotonic() - started
        suite = AgentSuite.objects.get(pk=suite.pk)
        runs = {c.agent: Run.objects.get(pk=c.run_id) for c in suite.cells.all()}
        stats = suite_stats(suite)
        # The runtime and the table, for the record (-s shows them; nothing is asserted on them).
        print(f"\nagent suite: {seconds:.0f}s to finish both cells\n{stats_csv(stats, table='agents')}")  # noqa: T201
        return SuiteRun(suite=suite, stats=stats, seconds=seconds, runs=runs)


@pytest.fixture
def committed(suite_run, stack):
    with stack.django_db_blocker.unblock():
        yield suite_run


def _trainings(run: Run) -> list[Experiment]:
    return list(Experiment.objects.filter(run=run, kind="train_eval").exclude(status__in=("held", "rejected")))


def _datasets(run: Run) -> set[str]:
    handles = {h for e in _trainings(run) for h in (e.action.get("data") or [])}
    return set(DataEntry.objects.filter(handle__in=handles).values_list("source__catalog", flat=True))


@pytest.mark.django_db  # also makes pytest-django create the test database when this file runs alone
def test_the_advance_clock_is_a_task_of_the_agents_queue():
    assert tasks.suite_advance_task.name == TaskName.SUITE_ADVANCE
    assert TaskName.SUITE_ADVANCE in app.tasks
    assert app.amqp.router.route({}, TaskName.SUITE_ADVANCE)["queue"].name == Queue.AGENTS


def test_both_cells_run_to_the_end_and_the_suite_finishes(committed):
    assert committed.suite.status == "finished"
    assert committed.suite.finished_at is not None
    for agent, run in committed.runs.items():
        assert run.status in RUN_TERMINAL_STATES, (agent, list(run.status_changes.values_list("to_status", "reason")))
        assert run.status == "finished", (agent, list(run.status_changes.values_list("to_status", "reason")))


def test_the_stats_table_is_computed_from_the_runs_records(committed):
    stats = committed.stats
    by_agent = {row["agent"]: row for row in stats["agents"]}
    assert set(by_agent) == {"heuristic", "heuristic-weak"}
    for cell in stats["cells"]:
        run = committed.runs[cell["agent"]]
        assert cell["run"] == str(run.uuid)
        completed = Experiment.objects.filter(run=run, kind="train_eval", status="succeeded",
                                              feedback_score__isnull=False)  # fmt: skip
        assert cell["iterations"] == completed.count()
        assert cell["iterations"] >= 1, f"{cell['agent']} completed no training+evaluation experiment"
        assert {r["experiment"] for r in cell["iteration_rows"]} == set(completed.values_list("handle", flat=True))
        assert cell["effective_iterations"] == sum(r["effective"] for r in cell["iteration_rows"])
        # Each effective iteration beats every earlier one (and θ0's feedback score): scores only climb.
        climbing = [r["feedback_score"] for r in cell["iteration_rows"] if r["effective"]]
        assert climbing == sorted(set(climbing))
        # θ0 and the reference were evaluated on the final split by the run's own final evaluation.
        assert cell["theta0"] is not None
        assert cell["reference"] is not None
        assert cell["score"] is not None
        assert cell["lite"] is not None
        assert 0.0 <= cell["lite"] <= 1.0
        assert cell["submissions_ran"] >= cell["iterations"]
        row = by_agent[cell["agent"]]
        assert (row["iterations"], row["effective_iterations"]) == (cell["iterations"], cell["effective_iterations"])
        assert row["settings_trained"] == 1
        assert row["hacking_rate"] == cell["hacking_rate"]
    csv_text = stats_csv(stats, table="agents")
    assert csv_text.splitlines()[0].startswith("agent,cells,ended,settings,settings_trained,settings_beat_base")
    assert len(csv_text.splitlines()) == 3


def test_the_weakened_switches_took_effect_in_the_recorded_experiments(committed):
    strong, weak = committed.runs["heuristic"], committed.runs["heuristic-weak"]
    assert weak.policy["heuristic"]["rank_data"] is False
    assert weak.policy["heuristic"]["fixed_recipe"] is True

    def recipes(run: Run) -> set[tuple[float, int]]:
        return {(e.action["hyperparameters"]["learning_rate"], e.action["hyperparameters"]["max_steps"])
                for e in _trainings(run)}  # fmt: skip

    # One fixed recipe: every training at the run's learning rate and train_steps.
    assert recipes(weak) == {(BUDGET.get("learning_rate", 2e-3), BUDGET["train_steps"])}
    # The heuristic screens with short runs and sweeps the learning rate: more than one recipe.
    assert len(recipes(strong)) > 1
    # No ranking: the weak agent took the catalog in search order and trained on the off-task set.
    assert OFF_TASK in _datasets(weak)
    assert OFF_TASK not in _datasets(strong)
