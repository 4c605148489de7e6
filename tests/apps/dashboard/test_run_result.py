"""The finished run's page leads with its result (apps.flows.scores through the result block)."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from apps.flows.scores import POSTTRAINBENCH_WEIGHTS, POSTTRAINBENCH_WEIGHTS_SOURCE, run_scores
from apps.integrity.choices import Adjudication, Observation
from apps.integrity.services import finding_adjudicate
from tests.apps.dashboard.world import finish_world

pytestmark = pytest.mark.django_db


def _text_of(html: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</', html, re.S)
    assert match, f"#{element_id} is missing"
    return " ".join(match.group(1).split())


def test_finished_run_page_leads_with_the_result(world, as_role):
    finish_world(world)
    scores = run_scores(run=world.run)
    html = as_role("viewer").get(reverse("dashboard:run-detail", args=[world.run.uuid])).content.decode()

    assert html.index('id="run-result"') < html.index('id="dag"')  # first thing under the title
    assert _text_of(html, "result-checkpoint") == scores.returned_checkpoint
    assert _text_of(html, "result-raw") == "0.550"
    assert _text_of(html, "result-theta0") == "0.250"
    assert _text_of(html, "result-reference") == "0.850"
    assert _text_of(html, "result-raw-ci") == f"95% CI {scores.raw.low:.3f}–{scores.raw.high:.3f} · n=20"
    # exp_0002 was adjudicated a violation: the gain is 0 and the page says why.
    assert _text_of(html, "result-gain") == "0.00"
    assert "adjudicated violation" in _text_of(html, "result-gain-note")
    assert _text_of(html, "result-hacking-rate") == "25.0%"
    assert _text_of(html, "result-blocked") == "1"
    run = world.run.uuid
    experiment = reverse("dashboard:experiment", args=[run, scores.returned_experiment])
    assert f'href="{experiment}" id="result-experiment"' in html
    assert f'href="{experiment}#lineage" id="result-lineage"' in html
    assert f'href="{reverse("dashboard:integrity", args=[run])}" id="result-integrity"' in html
    assert reverse("dashboard:report", args=[run, world.report.uuid]) in html


def test_a_running_run_has_no_result_block_but_links_its_reviewer_report(world, as_role):
    html = as_role("viewer").get(reverse("dashboard:run-detail", args=[world.run.uuid])).content.decode()
    assert 'id="run-result"' not in html
    assert f'href="{reverse("dashboard:report", args=[world.run.uuid, world.report.uuid])}" id="latest-report"' in html


def test_the_result_shows_the_leaderboard_cell_under_both_readings(world, as_role):
    finish_world(world)
    html = as_role("viewer").get(reverse("dashboard:run-detail", args=[world.run.uuid])).content.decode()
    # The run is flagged (exp_0002's adjudicated violation): both readings show θ0's 0.250, and say why.
    assert _text_of(html, "result-cell-substitute") == "0.250"
    assert _text_of(html, "result-cell-max").startswith("max(s, θ0): 0.250")
    assert "base substituted: run flagged" in _text_of(html, "result-cell-max")
    # A factory benchmark names no PostTrainBench benchmark: reported unweighted, and said so.
    assert "no published PostTrainBench weight" in _text_of(html, "result-cell-weight")


def test_the_scores_endpoint_and_command_give_the_pages_numbers(world, as_role):
    finish_world(world)
    world.run.benchmark.settings = {**world.run.benchmark.settings, "posttrainbench_name": "gsm8k"}
    world.run.benchmark.save(update_fields=["settings"])
    scores = run_scores(run=world.run)
    answer = as_role("viewer").get(f"/api/v1/runs/{world.run.uuid}/scores/")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["scores"]["raw"]["score"] == scores.raw.score == 0.55
    assert body["scores"]["raw"]["low"] == scores.raw.low
    assert body["scores"]["gain"] == 0.0
    board = body["leaderboard"]
    assert board["cell"]["substitute"]["value"] == 0.25  # flagged: θ0 stands in
    assert board["weight"] == POSTTRAINBENCH_WEIGHTS["gsm8k"]
    assert board["weighted"]["substitute"] == pytest.approx(0.25 * POSTTRAINBENCH_WEIGHTS["gsm8k"])
    assert board["weight_source"] == POSTTRAINBENCH_WEIGHTS_SOURCE

    out = io.StringIO()
    call_command("run_scores", str(world.run.uuid), stdout=out)
    text = out.getvalue()
    assert f"score        0.550  n=20  CI {scores.raw.low:.3f}–{scores.raw.high:.3f}" in text
    assert "Lite gain    0.000  0: the run has" in text
    cell = "0.250 (θ0 substituted when flagged or missing)  ·  0.250 (max(s, θ0))"
    assert f"{cell}  ·  weight {board['weight']:.4f}" in text
    out = io.StringIO()
    call_command("run_scores", str(world.run.uuid), "--json", stdout=out)
    assert json.loads(out.getvalue())["leaderboard"] == board
    with pytest.raises(CommandError, match="No run"):
        call_command("run_scores", "not-a-uuid")


def test_the_result_shows_suspected_findings_beside_the_hacking_rate(world, as_role):
    # exp_0003's partial metric attribution: a Reviewer now observes it EXECUTED but cannot rule yet.
    finding_adjudicate(
        finding=world.findings[("exp_0003", "metric_attribution")], observation=Observation.EXECUTED,
        adjudication=Adjudication.INSUFFICIENT_EVIDENCE, actor="reviewer_0001", rationale="cited score not found",
    )  # fmt: skip
    finish_world(world)
    viewer = as_role("viewer")
    html = viewer.get(reverse("dashboard:run-detail", args=[world.run.uuid])).content.decode()
    # 4 ran: exp_0002 adjudicated, exp_0003 suspected.
    assert _text_of(html, "result-hacking-rate") == "25.0–50.0% (1 suspected, not yet adjudicated)"
    assert _text_of(html, "result-suspected") == "1 suspected, not yet adjudicated"
    integrity = viewer.get(reverse("dashboard:integrity", args=[world.run.uuid])).content.decode()
    assert _text_of(integrity, "hacking-rate") == "25.0–50.0% (1 suspected, not yet adjudicated)"
    # The run has a Reviewer (reviewer_0001): its findings are the Reviewer's, not the operator's queue.
    queue = viewer.get(reverse("dashboard:review-queue")).content.decode()
    assert 'id="review-queue-empty"' in queue
