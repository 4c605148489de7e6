"""The demo's default settings tell the story (issue 32 item 5, issue 36 item 8), on the real stack.

A heuristic run with ``manage.py demo``'s defaults for everything that shapes the research (Workers
at once, Workers in all, the batch size; read from the command's own parser, so the test follows
the demo) and its trainings five times shorter, in the same proportion: a
Reviewer reports, the Main Agent takes a decision on that report, and once the run has finished
(stopped for its final evaluation as soon as that decision is on record) its page shows the
review that changed the decision with the evidence the report cited, and the result block
compares the returned checkpoint with θ0 and the reference. The run's records are the
product's: this test only starts and stops the run and reads the page.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils.html import escape

from apps.flows.management.commands.demo import Command as Demo
from apps.flows.reports import run_review_story
from apps.flows.runs import run_launch, run_stop
from apps.flows.scores import run_scores
from apps.jobs.choices import JOB_ACTIVE_STATES
from apps.jobs.models import Job
from apps.research.choices import RunStatus, Trigger
from apps.research.models import Decision, ResearchNode
from apps.reviews.models import ReviewReport
from tests.workers.agents.stack import run_status, wait_for

pytestmark = [pytest.mark.slow]
# The demo's trainings shortened five times, their proportion (screens against full trainings) kept.
SHORTER = 5


def _demo_defaults() -> dict:
    options = vars(Demo().create_parser("manage.py", "demo").parse_args([]))
    settings = {key: options[key] for key in ("parallel", "max_workers", "batch_size")}
    return settings | {key: options[key] // SHORTER for key in ("screen_steps", "train_steps")}


def _text(html: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</', html, re.S)
    assert match, f"#{element_id} is not on the page"
    return re.sub(r"\s+", " ", match.group(1)).strip()


@pytest.mark.django_db(transaction=True)
def test_the_demo_settings_make_a_review_change_a_decision_and_the_page_shows_it(installed):
    stack = installed
    settings = _demo_defaults()
    run = run_launch(benchmark="minibench/arithmetic", policy="heuristic", name="agents: the demo's story",
                     wall_seconds=1800, accelerator_seconds=3600, actor="test", **settings)  # fmt: skip
    decision = wait_for(lambda: Decision.objects.filter(run=run, trigger=Trigger.REVIEW_REPORT).first(),
                        timeout=900, what="a decision taken on a Reviewer's report", stack=stack, every=2)  # fmt: skip
    run_stop(run=run, actor="test", reason="the review changed a decision: on to the final evaluation")
    wait_for(lambda: run_status(run) in (RunStatus.FINISHED, RunStatus.FAILED), timeout=600,
             what="the final evaluation", stack=stack, every=2)  # fmt: skip
    assert run_status(run) == RunStatus.FINISHED
    # Nothing of this run still writes when the next test flushes the database (the stack is shared).
    wait_for(lambda: not Job.objects.filter(run=run, status__in=JOB_ACTIVE_STATES).exists(), timeout=180,
             what="the run's last jobs to end", stack=stack, every=2)  # fmt: skip

    # The Reviewer was asked for by the Main Agent and reported before the decision taken on it.
    reviewer = ResearchNode.objects.filter(run=run, kind="reviewer").order_by("created_at").first()
    assert reviewer is not None
    report = ReviewReport.objects.filter(run=run).order_by("created_at").first()
    assert report is not None
    assert report.created_at <= decision.created_at
    story = run_review_story(run=run)
    assert story.changed
    assert story.changed[0].decision == decision
    assert story.changed[0].evidence, "the report cited no evidence"

    # The finished run's page: the review that changed the decision, with its evidence ...
    admin = get_user_model().objects.create_superuser("demo-story-admin", password="pw-demo-story-123")
    client = Client()
    client.force_login(admin)
    page = client.get(f"/runs/{run.uuid}/")
    assert page.status_code == 200
    html = page.content.decode()
    reviews = html[html.index('id="result-reviews"') :]
    assert f"{story.changed[0].reviewer} report" in reviews
    assert f"decision: {decision.kind}" in reviews
    assert escape(story.changed[0].evidence[0]) in reviews
    # ... and the result block: the returned checkpoint against θ0 and the reference.
    scores = run_scores(run=run)
    assert scores.raw is not None
    assert scores.theta0 is not None
    assert scores.reference is not None
    assert _text(html, "result-theta0") == f"{scores.theta0.score:.3f}"
    assert _text(html, "result-reference") == f"{scores.reference.score:.3f}"
    comparison = _text(html, "result-comparison")
    assert "θ0" in comparison, comparison
    assert "the reference" in comparison, comparison
