"""The pages people read, in headless Chromium: layout at 1280, 1440 and 390 px, the finished run's
result, charts, the integrity report's codes and never-run submissions, and guidance outcomes.

The run is the dashboard tests' world (tests/apps/dashboard/world.py), ended through the real
services (``finish_world``: stop, final-evaluation jobs with per-sample rows, run_finish) — no
research run is trained here, so this file costs seconds, not minutes. The refused spawns of the
guidance test go through the real tool endpoint of the live server with a Main Agent token, so
the recorder and its live event are the product's (STYLE.md 31a).
"""

from __future__ import annotations

import pytest
import requests

from apps.experiments.services import experiment_create, experiment_set_integrity
from apps.expos.auth import agent_token_issue
from apps.flows.scores import run_scores
from apps.integrity.choices import ADJUDICATION_MEANING, OBSERVATION_MEANING, Observation
from apps.integrity.models import IntegrityFinding
from apps.jobs.models import Job
from apps.research.choices import NodeKind
from apps.research.models import Guidance, ResearchNode, Run
from apps.research.services import decision_record, guidance_mark_read
from tests.apps.dashboard.world import PASSWORD, SUBCATEGORIES, build_world, finish_world
from tests.e2e.conftest import act, log_in, screenshot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
WAIT_MS = 15_000
WIDTHS = (1280, 1440, 390)


def _never_ran(world):
    """A submission cancelled before any job started, whose checks all came back clean: the case
    the integrity report used to show as twelve ✓ and "accepted"."""
    experiment = experiment_create(
        run=world.run, owner=world.nodes["w2"], kind="eval_only", input_checkpoint=world.run.base_checkpoint,
        action={"evaluate": "feedback"}, status="cancelled",
    )  # fmt: skip
    for sub in SUBCATEGORIES:
        IntegrityFinding.objects.create(experiment=experiment, subcategory=sub, observation=Observation.NOT_FOUND_FULL)
    experiment_set_integrity(experiment=experiment, status="accepted", actor="auto", reason="every subcategory clean")
    return experiment


# Records as a real run writes them: long unbroken values (artifact paths, hashes, a recipe's
# long prompt template) are what pushed the experiment and job pages past 1440 px.
LONG_PATH = "file:///var/lib/rsiweb/artifacts/checkpoints/" + "0f" * 32 + "/model-00001-of-00002.safetensors"
LONG_TEMPLATE = "<|im_start|>system\\nYou are a careful arithmetic assistant." * 4


def _with_long_values(world) -> None:
    job = world.jobs["running"]
    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "checkpoint_uri": LONG_PATH, "sha256": "ab" * 64})
    experiment = world.exp["e2"]  # an action is immutable once set: a new experiment carries the long one
    world.extra["long"] = experiment_create(
        run=world.run, owner=world.nodes["w3"], kind="train_eval", input_checkpoint=experiment.input_checkpoint,
        action={**experiment.action, "template": LONG_TEMPLATE, "artifact": LONG_PATH}, status="cancelled",
    )  # fmt: skip
    finding = world.findings[("exp_0002", "test_set_access")]
    evidence = {**finding.evidence, "summary": LONG_TEMPLATE, "artifact": LONG_PATH, "digest": "cd" * 64}
    IntegrityFinding.objects.filter(pk=finding.pk).update(evidence=evidence)


def _finished_world():
    world = build_world()
    never = _never_ran(world)
    _with_long_values(world)
    finish_world(world)
    return world, never


def _overflow(page) -> dict:
    return page.evaluate(
        """() => ({ scroll: document.documentElement.scrollWidth, inner: window.innerWidth,
                    wide: Array.from(document.querySelectorAll('body *'))
                      .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1)
                      .slice(0, 5).map((e) => e.tagName + '.' + e.className + '#' + e.id) })"""
    )


def test_every_page_fits_1280_and_1440_and_reads_at_390(transactional_db, live_url, page):
    world, never = act(_finished_world)
    run = world.run.uuid
    pages = {
        "runs": "/",
        "run": f"/runs/{run}/",
        "experiment": f"/runs/{run}/experiments/exp_0002/",
        "long experiment": f"/runs/{run}/experiments/{world.extra['long'].handle}/",
        "report": f"/runs/{run}/reports/{world.report.uuid}/",
        "integrity": f"/runs/{run}/integrity/",
        "job": f"/jobs/{world.jobs['running'].uuid}/",
        "datapool": "/datapool/",
        "data": "/datapool/data_0001/",
    }
    log_in(page, live_url, "admin-person", PASSWORD)  # admins see the most: adjudication forms
    overflowing = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in pages.items():
            page.goto(f"{live_url}{path}")
            if name == "run":
                page.locator(".charts").scroll_into_view_if_needed()
                page.wait_for_selector("body[data-charts='loaded']", timeout=30_000)
            if name == "job":
                page.wait_for_selector("#job-metrics-chart .main-svg", timeout=WAIT_MS)
            measured = _overflow(page)
            if measured["scroll"] > measured["inner"]:
                overflowing.append(f"{name} at {width}px: {measured}")
            if name == "run":
                screenshot(page, f"layout-run-{width}")
    assert overflowing == []
    assert page.console_errors == []


def test_finished_run_page_leads_with_the_result_and_charts_read_well(transactional_db, live_url, page):
    world, _ = act(_finished_world)
    scores = act(run_scores, run=world.run)
    log_in(page, live_url, "viewer-person", PASSWORD)
    page.goto(f"{live_url}/runs/{world.run.uuid}/")

    result = page.locator("#run-result")
    assert result.is_visible()
    assert page.inner_text("#result-checkpoint") == scores.returned_checkpoint
    assert page.inner_text("#result-raw") == f"{scores.raw.score:.3f}"
    assert page.inner_text("#result-theta0") == f"{scores.theta0.score:.3f}"
    assert page.inner_text("#result-reference") == f"{scores.reference.score:.3f}"
    assert page.inner_text("#result-raw-ci") == f"95% CI {scores.raw.low:.3f}–{scores.raw.high:.3f} · n=20"
    assert page.inner_text("#result-gain") == "0.00"  # exp_0002's adjudicated violation
    assert "adjudicated violation" in page.inner_text("#result-gain-note")
    assert page.inner_text("#result-hacking-rate") == "25.0%"
    assert page.inner_text("#result-blocked") == "1"
    # The returned checkpoint against θ0 and the reference, in words, from the same scores.
    comparison = page.inner_text("#result-comparison")
    for label, other in (("θ0", scores.theta0.score), ("the reference", scores.reference.score)):
        diff = scores.raw.score - other
        side = "above" if diff > 0 else "below" if diff < 0 else "ties"
        assert (f"{abs(diff):.3f} {side} {label}" if diff else f"ties {label}") in comparison, comparison
    # The review that changed a decision: the report, the decision taken on it, the evidence it cited.
    change = page.locator("#result-reviews li.review-change")
    assert change.count() == 1
    assert change.locator("a.review-change-report").inner_text() == "reviewer_0001 report"
    assert change.locator("a.decisionref").inner_text() == "decision: revise"
    assert "the review found contamination" in change.locator(".review-change-rationale").inner_text()
    evidence = change.locator(".review-change-evidence li").all_inner_texts()
    assert evidence == ["exp_0001's gain holds on resampling", "exp_0002 used sealed items"]
    # It is the first thing under the title, above the DAG.
    assert page.locator("#run-result").bounding_box()["y"] < page.locator("#dag").bounding_box()["y"]
    screenshot(page, "run-result")

    # Charts: θ0 and reference lines on both score charts, time axes of minutes, a log toggle.
    page.locator(".charts").scroll_into_view_if_needed()
    page.wait_for_selector("body[data-charts='loaded']", timeout=30_000)
    for chart in ("best_so_far", "experiment_scores"):
        labels = page.evaluate(
            "(id) => (document.getElementById(id).layout.annotations || []).map((a) => a.text)", f"chart-{chart}"
        )
        assert any(label.startswith("θ0 (feedback)") for label in labels), (chart, labels)
        assert any(label.startswith("reference (feedback)") for label in labels), (chart, labels)
        span = page.evaluate(
            "(id) => { const r = document.getElementById(id)._fullLayout.xaxis.range;"
            " return new Date(r[1]) - new Date(r[0]); }",
            f"chart-{chart}",
        )
        assert span >= 120_000, (chart, span)  # never sub-millisecond ticks around one point
    hover = page.evaluate("document.getElementById('chart-experiment_scores').data.map((t) => t.text).flat()")
    assert any(text.startswith("exp_0001 · worker_0001") for text in hover)
    card = page.locator(".chart", has=page.locator("#chart-experiment_scores"))
    card.locator("input.chart-log").check()
    page.wait_for_function("document.getElementById('chart-experiment_scores').layout.yaxis.type === 'log'")
    before = page.evaluate("document.getElementById('chart-experiment_scores').data.length")
    card.locator("input.chart-smoothing").fill("0.6")
    page.wait_for_function(
        "(n) => document.getElementById('chart-experiment_scores').data.length > n", arg=before, timeout=WAIT_MS
    )

    # The result's links lead to the records behind it.
    page.click("#result-integrity")
    page.wait_for_selector("#integrity-matrix")
    page.go_back()
    page.click("#result-lineage")
    page.wait_for_selector("#lineage")
    assert "/experiments/" in page.url

    # The job page: one y axis per metric, integer step ticks, smoothing.
    job = world.jobs["running"]
    page.goto(f"{live_url}/jobs/{job.uuid}/")
    page.wait_for_selector("#job-metrics-chart .main-svg", timeout=WAIT_MS)
    ticks = page.evaluate("document.getElementById('job-metrics-chart').layout.xaxis.tickvals")
    assert ticks == [10, 20]
    page.locator("#job-metrics-tools input.chart-log").check()
    page.wait_for_function("document.getElementById('job-metrics-chart').layout.yaxis.type === 'log'")
    assert page.console_errors == []


def test_integrity_report_explains_codes_and_shows_never_run_submissions(transactional_db, live_url, page):
    world, never = act(_finished_world)
    log_in(page, live_url, "viewer-person", PASSWORD)
    page.goto(f"{live_url}/runs/{world.run.uuid}/integrity/")

    row = page.locator("#integrity-matrix tbody tr", has=page.locator(f"text={never.handle}"))
    assert row.locator("td").last.inner_text() == "not run"
    assert row.locator(".cell-clean").count() == 0  # no ✓ for checks of nothing
    assert row.locator(".cell-notrun").count() == 12
    legend = page.inner_text("#code-legend")
    for code, meaning in [*OBSERVATION_MEANING.items(), *ADJUDICATION_MEANING.items()]:
        assert code in legend
        assert meaning in legend
    violation = page.locator("#integrity-matrix .cell-violation").first.get_attribute("title")
    assert ADJUDICATION_MEANING["EXPLICIT_VIOLATION"] in violation
    assert OBSERVATION_MEANING["EXECUTED"] in violation
    # The summary counts the rows shown.
    counts = [int(n) for n in page.inner_text("#verdict-counts").split(" / ")]
    assert sum(counts) == page.locator("#integrity-matrix tbody tr").count() == 6
    assert counts[3] == 2  # not run: the cancelled one with clean checks, and the long one
    screenshot(page, "integrity-not-run")
    assert page.console_errors == []


def test_guidance_whose_decision_was_refused_reads_not_carried_out(transactional_db, live_url, page):
    world = act(build_world)
    run = world.run
    act(lambda: Run.objects.filter(pk=run.pk).update(max_parallel_workers=2))  # worker_0002 and 0003 are active
    log_in(page, live_url, "operator-person", PASSWORD)
    page.goto(f"{live_url}/runs/{run.uuid}/")
    page.wait_for_selector("body[data-live='live']", timeout=WAIT_MS)
    assert "jobs already running go on" in page.inner_text("#control-help")

    text = "Open a DPO branch from exp_0001."
    page.fill("#guidance-form textarea", text)
    page.click("#guidance-form button[type=submit]")
    page.locator("li.guidance.pending", has_text=text).wait_for(timeout=WAIT_MS)

    def decide():
        guidance_mark_read(run=run)
        posted = Guidance.objects.get(run=run, text=text)
        return decision_record(run=run, kind="branch", trigger="guidance", rationale="branch as the operator asked",
                               guidance=[posted])  # fmt: skip

    decision = act(decide)
    page.locator("li.guidance.applied", has_text=text).wait_for(timeout=WAIT_MS)

    # The Main Agent tries to spawn for that decision, twice; the run is at its Worker limit.
    main = act(lambda: ResearchNode.objects.get(run=run, kind=NodeKind.MAIN))
    token, _ = act(agent_token_issue, run=run, node=main, role="main")
    for _ in range(2):
        answer = requests.post(
            f"{live_url}/api/v1/tools/state_add_new_worker",
            json={"task": "DPO from exp_0001", "decision": str(decision.uuid)},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] == "worker_limit"

    # Each refusal re-announces the guidance: wait for the second (under load the page can show
    # the first, "not carried out" already, before the second arrives).
    failed = page.locator("li.guidance.failed", has_text=text).filter(has_text="refused 2×")
    failed.wait_for(timeout=WAIT_MS)
    assert failed.locator(".badge").inner_text() == "not carried out"
    assert "failed: state_add_new_worker refused 2× (409 worker_limit)" in failed.inner_text()
    assert "spawned no Worker or Reviewer" in failed.inner_text()
    # The older guidance, applied by a decision that spawned worker_0003, says so.
    applied = page.locator("li.guidance.applied", has_text="Look for contamination")
    assert "spawned worker_0003" in applied.inner_text()
    screenshot(page, "guidance-not-carried-out")
    assert page.console_errors == []
