"""Honest state (issue 36, item 4): budgets that overrun and move while jobs train, a Stop that
cancels what is queued, "not run" for a submission that never ran, one flag for a run wherever it
is listed, no one-seed CI, and the demo's run time and θ0 verdict under the one rule."""

from __future__ import annotations

import io
import re

import pytest
from django.urls import reverse

from apps.dashboard import selectors
from apps.experiments.services import experiment_create, experiment_set_integrity
from apps.flows.compare import ablation_groups
from apps.flows.management.commands.demo import Command as DemoCommand
from apps.flows.management.commands.demo import theta0_verdict
from apps.jobs.choices import JobStatus
from apps.jobs.services import job_enqueue
from apps.research.models import Run
from tests.apps.dashboard.compare_world import build_pair
from tests.apps.dashboard.world import finish_world

pytestmark = pytest.mark.django_db

JSON = {"HTTP_ACCEPT": "application/json"}


def _bar(bars, label):
    return next(bar for bar in bars if bar.label == label)


def test_budget_bars_show_overruns_and_the_jobs_training_now(world, as_role):
    run = world.run
    # The world's running training started 3 minutes ago: it counts before it is charged.
    live = _bar(selectors.run_budget_bars(run), "accelerator")
    assert 900 + 170 < live.used < 900 + 200
    Run.objects.filter(pk=run.pk).update(used_accelerator_seconds=3600 * 1.32 - 180, budget_wall_seconds=1200)
    run.refresh_from_db()
    bars = selectors.run_budget_bars(run)
    accelerator, wall = _bar(bars, "accelerator"), _bar(bars, "wall clock")
    assert 131.5 < accelerator.percent < 133.5
    assert (accelerator.fill, accelerator.over) == (100.0, True)
    assert wall.percent > 140  # 30 minutes of a 20-minute wall clock
    html = as_role("viewer").get(reverse("dashboard:run-detail", args=[run.uuid])).content.decode()
    values = dict(re.findall(r'data-budget="([^"]+)".*?<span class="budget-value">(\d+)%</span>', html, re.S))
    assert values["accelerator"] in ("132", "133")
    assert int(values["wall clock"]) > 140
    assert 'class="budget over" data-budget="accelerator"' in html
    listed = as_role("viewer").get(reverse("dashboard:run-list")).content.decode()
    assert 'class="budget over" data-budget="accelerator"' in listed


def test_a_finished_run_does_not_count_jobs_in_flight(world):
    finish_world(world)  # the final evaluation does not wait for exp_0004's training: it is still running
    world.run.refresh_from_db()
    assert (world.run.status, world.jobs["running"].status) == ("finished", "running")
    # What was charged for the jobs that ended, and nothing for the one still marked running.
    assert _bar(selectors.run_budget_bars(world.run), "accelerator").used == world.run.used_accelerator_seconds


def test_stop_cancels_queued_trainings_and_says_what_it_lets_finish(world, as_role):
    run = world.run
    queued_train = job_enqueue(kind="train", spec={"recipe": "sft"}, run=run, experiment=world.exp["e4"])
    queued_eval = job_enqueue(kind="evaluate", spec={"split": "feedback"}, run=run, experiment=world.exp["e1"])
    client = as_role("operator")
    help_text = client.get(reverse("dashboard:run-detail", args=[run.uuid])).content.decode()
    assert "queued trainings are cancelled at once" in help_text
    answer = client.post(reverse("dashboard:run-control", args=[run.uuid]), {"action": "stop"}, **JSON)
    assert answer.json()["status"] == "stopping"
    queued_train.refresh_from_db(), queued_eval.refresh_from_db(), world.jobs["running"].refresh_from_db()
    assert queued_train.status == JobStatus.CANCELLED
    # The evaluation of a finished training and the running training go on to their end.
    assert (queued_eval.status, world.jobs["running"].status) == (JobStatus.QUEUED, JobStatus.RUNNING)
    event = run.events.get(type="run.stop_requested")
    assert event.arguments["cancelled_jobs"] == [str(queued_train.uuid)]
    assert {j["job"] for j in event.arguments["finishing_jobs"]} == {str(queued_eval.uuid),
                                                                     str(world.jobs["running"].uuid)}  # fmt: skip
    page = client.get(reverse("dashboard:run-detail", args=[run.uuid])).content.decode()
    assert re.search(r"Stopped by user:operator-person \(stop from the dashboard\).*1 queued job cancelled, 2 let "
                     r"finish", page)  # fmt: skip


def test_a_submission_that_never_ran_reads_not_run(world, as_role):
    never = experiment_create(run=world.run, owner=world.nodes["w3"], kind="train_eval",
                              input_checkpoint=world.run.base_checkpoint, action={"recipe": "sft"})  # fmt: skip
    experiment_set_integrity(experiment=never, status="accepted", actor="auto", reason="recorded clean")
    page = as_role("viewer").get(reverse("dashboard:experiment", args=[world.run.uuid, never.handle]))
    html = page.content.decode()
    assert re.search(r'id="experiment-verdict" class="badge notrun"[^>]*>not run<', html)
    assert page.context["verdict"] == "not run"
    assert "integrity-accepted" not in html.split('id="integrity"')[0]
    ran = as_role("viewer").get(reverse("dashboard:experiment", args=[world.run.uuid, "exp_0001"]))
    assert ran.context["verdict"] == "accepted"


def test_a_run_with_a_ruled_violation_is_flagged_wherever_it_is_listed(world, as_role):
    run = world.run
    assert run.flagged is False  # only exp_0002's adjudicated violation flags it
    client = as_role("viewer")
    header = client.get(reverse("dashboard:run-detail", args=[run.uuid])).content.decode()
    badge = re.search(r'<span id="run-flagged"[^>]*>', header).group(0)
    assert "hidden" not in badge
    assert 'data-violation="1"' in badge
    assert "1 submission ruled a violation" in badge
    listed = client.get(reverse("dashboard:run-list")).content.decode()
    row = re.search(rf'<tr data-run="{run.uuid}">.*?</tr>', listed, re.S).group(0)
    assert 'class="badge flagged"' in row
    pair = build_pair()
    compare = client.get(f"{reverse('dashboard:run-compare')}?runs={run.uuid}&runs={pair.a.uuid}")
    flags = {column["run"].pk: column["flags"] for column in compare.context["columns"]}
    assert flags == {run.pk: ["1 submission ruled a violation"], pair.a.pk: []}
    assert compare.content.decode().count('class="badge flagged"') == 2  # its header line and its score row


def test_one_seed_is_not_drawn_as_a_confidence_interval(people, as_role):
    pair = build_pair()
    [group] = ablation_groups([pair.a, pair.b])
    assert all(arm["ci_low"] is None and arm["n_scored"] == 1 for arm in group["arms"])
    page = as_role("viewer").get(reverse("dashboard:run-ablation")).content.decode()
    assert "one seed: no CI" in page
    assert "95% CI over seeds" not in page


@pytest.mark.parametrize(("theta0_correct", "beats"), [(19, False), (5, True)])
def test_the_demo_prints_beats_theta0_only_under_the_one_rule(theta0_correct, beats):
    # The returned checkpoint: 20 of x0..x39 right on the final split; θ0 the first theta0_correct.
    run = build_pair(theta0_correct=theta0_correct).a
    verdict = theta0_verdict(run)
    assert verdict.startswith("beats θ0") is beats
    if not beats:  # 0.500 vs 0.475: higher, but the CI of the gain includes 0
        assert "includes 0" in verdict


def test_the_demo_reports_the_runs_time_not_the_commands():
    run = build_pair().a  # started 30 minutes ago, finished 25 minutes later
    out = io.StringIO()
    DemoCommand(stdout=out)._report(run, None, 4323.0)
    assert out.getvalue().startswith("run ended: finished after 1500s (this command has been up 4323s)")
