"""A real heuristic research run, watched live in headless Chromium from start to finish.

The real stack (web server, Celery workers on the gpu, agents and default queues, the built
minibench: tests/e2e/conftest.py ``research_stack``) runs a small heuristic run: two Workers
in parallel, a cross-Worker Reviewer, the Main Agent's decisions, real training and sealed
evaluation, the final evaluation. An operator watches the run page, which never reloads: the
research DAG grows, the guidance posted from the page's form shows at once and goes forward to
applied (pending first, unless the Main Agent is quicker than the page), the decision and
experiment counts grow, and the status reaches "finished". Every change the page shows comes
from the services that made it (STYLE.md 31a): this test publishes nothing and writes no
research record; it only starts the run, as ``manage.py start_run`` does.
"""

from __future__ import annotations

import pytest

from apps.flows.runs import run_launch
from apps.live.events import LiveEvent
from apps.research.choices import RunStatus
from apps.research.models import Decision, Guidance, ResearchEdge, ResearchNode, Run
from apps.reviews.models import ReviewReport
from tests.apps.dashboard import live_helpers as lh
from tests.apps.dashboard.world import PASSWORD, make_people
from tests.e2e.conftest import act, log_in, screenshot
from tests.workers.agents import stack as support

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
# The smallest run that still has every part (STYLE: CI time): two branches in parallel
# (data-screen and recipe-sweep), no follow-up branch (max_workers=2), a few training steps.
RUN_OPTIONS = {
    "parallel": 2,
    "max_workers": 2,
    "screen_steps": 4,
    "train_steps": 8,
    "batch_size": 16,
    "wall_seconds": 1200,
    "accelerator_seconds": 3600,
}
RUN_TIMEOUT_MS = 20 * 60 * 1000
STEP_TIMEOUT_MS = 5 * 60 * 1000
GUIDANCE = "Compare every branch with the θ0 baseline before building on it."


def _count(page, selector: str) -> int:
    text = page.inner_text(selector)
    return int(text) if text.isdigit() else 0


def _state_equals_fresh_snapshot(page) -> None:
    """The browser's live state (snapshot + events, applied by live.js) == a fresh snapshot."""
    held, fresh = page.evaluate(
        """async () => {
            const urls = JSON.parse(document.getElementById('page-config').textContent).urls;
            const fresh = await (await fetch(urls.snapshot)).json();
            return [JSON.parse(JSON.stringify(rsiLive.runStateToSnapshot(window.rsiRunState))), fresh];
        }"""
    )
    assert lh.run_state(held) == lh.run_state(fresh)


def _wait_above(page, selector: str, floor: int, timeout: int) -> None:
    page.wait_for_function(
        "([selector, floor]) => parseInt(document.querySelector(selector).textContent, 10) > floor",
        arg=[selector, floor],
        timeout=timeout,
    )


def test_operator_watches_a_real_run_from_start_to_finish(transactional_db, research_stack, page):
    act(support.install, research_stack.minibench)  # again: a flush between tests removed the rows
    act(make_people)
    log_in(page, research_stack.url, "operator-person", PASSWORD)

    run = act(run_launch, benchmark="minibench/arithmetic", policy="heuristic", name="e2e: live heuristic run",
              actor="test", **RUN_OPTIONS)  # fmt: skip
    page.goto(f"{research_stack.url}/runs/{run.uuid}/")
    page.wait_for_selector("body[data-live='live']", timeout=30_000)
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    page.evaluate(
        """() => { window.__seen = {}; window.rsiProbe = (event) => {
            window.__seen[event] = (window.__seen[event] || 0) + 1; }; }"""
    )
    drawn_at_start = page.evaluate("window.rsiGraphs.dag.nodes().length")
    decisions_at_start = _count(page, "#decision-count")
    experiments_at_start = _count(page, "#experiment-count")

    # The Main Agent's first planning step spawns two Workers; the page draws them as they come.
    page.wait_for_function("window.rsiGraphs.dag.nodes('[kind = \"worker\"]').length >= 2", timeout=STEP_TIMEOUT_MS)
    screenshot(page, "real-run-workers")

    # Guidance from the page's form: shown at once, applied by the Main Agent's next planning step.
    # That step can come before the browser has drawn the pending item (the guidance wakes the Main
    # Agent), so the test notes every state the item is drawn in and asks that they only go forward.
    page.evaluate(
        """(text) => {
            const order = ["pending", "read", "applied", "failed"];
            window.__guidanceDrawn = [];
            const note = () => {
                for (const li of document.querySelectorAll("#guidance-list li.guidance")) {
                    if (!li.textContent.includes(text)) continue;
                    const drawn = window.__guidanceDrawn, state = order.find((s) => li.classList.contains(s));
                    if (drawn[drawn.length - 1] !== state) drawn.push(state);
                }
            };
            new MutationObserver(note).observe(document.getElementById("guidance-list"),
                {subtree: true, childList: true, attributes: true});
        }""",
        GUIDANCE,
    )
    page.fill("#guidance-form textarea", GUIDANCE)
    page.click("#guidance-form button[type=submit]")
    page.locator("li.guidance", has_text=GUIDANCE).wait_for(timeout=15_000)
    applied = page.locator("li.guidance.applied", has_text=GUIDANCE)
    applied.wait_for(timeout=STEP_TIMEOUT_MS)
    applied.locator("a.decisionref").wait_for(timeout=STEP_TIMEOUT_MS)  # bound to the decision that applied it
    drawn = page.evaluate("window.__guidanceDrawn")
    assert drawn[-1] == "applied", drawn
    assert drawn == sorted(drawn, key=["pending", "read", "applied"].index), drawn

    # Experiments appear as the Workers submit them; the Reviewer joins once both branches have results.
    _wait_above(page, "#experiment-count", experiments_at_start, STEP_TIMEOUT_MS)
    page.wait_for_function("window.rsiGraphs.dag.nodes('[kind = \"reviewer\"]').length >= 1", timeout=RUN_TIMEOUT_MS)
    page.wait_for_function(
        "window.rsiGraphs.dag.edges('[kind = \"review_scope\"]').length >= 2", timeout=STEP_TIMEOUT_MS
    )
    screenshot(page, "real-run-reviewer")

    # The run ends on its own: the Main Agent stops, the final evaluation runs, the run finishes.
    page.wait_for_selector("#run-status.status-finished", timeout=RUN_TIMEOUT_MS)
    assert page.evaluate("window.__sameDocument") is True  # all of it live, no reload
    assert page.evaluate("window.rsiGraphs.dag.nodes().length") > drawn_at_start
    assert _count(page, "#decision-count") > decisions_at_start
    assert _count(page, "#experiment-count") > experiments_at_start
    seen = page.evaluate("window.__seen")
    shown = (
        LiveEvent.RUN_UPDATED, LiveEvent.NODE_CREATED, LiveEvent.NODE_UPDATED, LiveEvent.EDGE_CREATED,
        LiveEvent.DECISION_CREATED, LiveEvent.GUIDANCE_UPDATED, LiveEvent.REPORT_CREATED,
        LiveEvent.EXPERIMENT_CREATED, LiveEvent.EXPERIMENT_UPDATED, LiveEvent.JOB_UPDATED,
    )  # fmt: skip
    for event in shown:
        assert seen.get(event), f"the page never received {event}: {seen}"  # fmt: skip
    page.wait_for_timeout(1000)  # the last events of the finish (jobs, run) settle
    _state_equals_fresh_snapshot(page)
    screenshot(page, "real-run-finished")
    assert page.console_errors == []

    # What the page showed is what the run did: the parts this test was sized to have.
    def recorded():
        finished = Run.objects.get(pk=run.pk)
        workers = ResearchNode.objects.filter(run=run, kind="worker").count()
        reviewers = ResearchNode.objects.filter(run=run, kind="reviewer").count()
        kinds = set(Decision.objects.filter(run=run).values_list("kind", flat=True))
        guidance = Guidance.objects.get(run=run, text=GUIDANCE)
        return finished, workers, reviewers, kinds, guidance

    finished, workers, reviewers, kinds, guidance = act(recorded)
    assert finished.status == RunStatus.FINISHED
    assert workers >= 2
    assert reviewers >= 1
    assert {"branch", "verify"} <= kinds
    assert guidance.applied_decision_id is not None
    assert act(lambda: ResearchEdge.objects.filter(run=run, kind="review_scope").count()) >= 2
    assert act(lambda: ReviewReport.objects.filter(run=run).exists())
    assert page.inner_text("#decision-count") == str(act(lambda: Decision.objects.filter(run=run).count()))
