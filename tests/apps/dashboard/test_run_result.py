"""The finished run's page leads with its result (apps.research.scores through the result block)."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from apps.research.scores import run_scores
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
