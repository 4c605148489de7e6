"""The dashboard in headless Chromium against the live web server (uvicorn) on the test database.

A person signs in, watches a running run's research DAG grow without reloading, opens a node's
side panel, posts guidance and sees the Main Agent apply it, survives a dropped socket, and
opens the experiment, review, job, integrity and datapool pages, with no console errors.
The run changes through the services a Main Agent and the job engine call, and the page learns
of it from the events those services publish; the test publishes nothing (STYLE.md 31a).
test_live_run_browser.py watches a whole real run the same way. Screenshots land in
test-artifacts/screenshots/ for people to look at.
"""

from __future__ import annotations

import pytest

from apps.experiments.services import experiment_create
from apps.flows.runs import run_resume
from apps.jobs.services import job_report
from apps.research.models import Guidance, Run
from apps.research.services import decision_record, guidance_mark_read, reviewer_add, worker_add
from tests.apps.dashboard import live_helpers as lh
from tests.apps.dashboard.world import PASSWORD, build_world
from tests.e2e.conftest import act, log_in, screenshot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
WAIT_MS = 15_000


def _wait_live(page) -> None:
    page.wait_for_selector("body[data-live='live']", timeout=WAIT_MS)


def _dag_nodes(page) -> int:
    return page.evaluate("window.rsiGraphs.dag.nodes().length")


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


def _click_dag_node(page, node_uuid: str) -> None:
    """Click a node where cytoscape drew it (the canvas has no DOM element per node)."""
    position = page.evaluate("(id) => window.rsiGraphs.dag.getElementById(id).renderedPosition()", node_uuid)
    box = page.locator("#dag").bounding_box()
    page.mouse.click(box["x"] + position["x"], box["y"] + position["y"])


def test_operator_watches_the_dag_grow_and_steers(transactional_db, live_url, page):
    world = build_world()
    run = world.run
    log_in(page, live_url, "operator-person", PASSWORD)
    assert page.locator("table.runs").inner_text().count("arithmetic sprint") == 1
    screenshot(page, "runs-list")

    page.goto(f"{live_url}/runs/{run.uuid}/")
    _wait_live(page)
    page.wait_for_function("window.rsiGraphs.dag.nodes().length === 4", timeout=WAIT_MS)
    assert page.inner_text("#best-score") == "0.420"
    assert (page.inner_text("#decision-count"), page.inner_text("#experiment-count")) == ("3", "4")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    # The Main Agent branches from worker_0003 and asks for a cross-Worker review.
    def grow():
        decision = decision_record(run=run, kind="branch", trigger="review_report", rationale="try DPO from exp_0001")
        dpo = worker_add(run=run, task="DPO from exp_0001", predecessors=[world.nodes["w3"]], decision=decision)
        review = reviewer_add(
            run=run, question="Do worker_0002 and worker_0003 agree?", scope=[world.nodes["w2"], world.nodes["w3"]]
        )
        experiment_create(
            run=run, owner=dpo, kind="train_eval", input_checkpoint=run.base_checkpoint, parents=[world.exp["e1"]],
            action={"recipe": "dpo"},
        )  # fmt: skip
        job_report(job=world.jobs["running"], progress=0.8, log_line="step 40: loss=1.1")
        return dpo, review

    dpo, review = act(grow)
    page.wait_for_function("window.rsiGraphs.dag.nodes().length === 6", timeout=WAIT_MS)
    page.wait_for_function("window.rsiGraphs.exp.nodes().length === 5", timeout=WAIT_MS)
    page.wait_for_function("document.getElementById('decision-count').textContent === '4'", timeout=WAIT_MS)
    assert page.inner_text("#experiment-count") == "5"
    assert page.evaluate("window.__sameDocument") is True
    edges = page.evaluate("window.rsiGraphs.dag.edges().map(e => [e.data('source'), e.data('target'), e.data('kind')])")
    assert [str(world.nodes["w3"].uuid), str(dpo.uuid), "context"] in edges
    assert [str(world.nodes["w2"].uuid), str(review.uuid), "review_scope"] in edges
    assert (
        page.evaluate("(id) => window.rsiGraphs.dag.getElementById(id).data('label')", str(dpo.uuid))
        == "worker_0004\nbranch"
    )
    page.wait_for_function("parseFloat(document.querySelector('#job-list .fill').style.width) === 80", timeout=WAIT_MS)
    _state_equals_fresh_snapshot(page)

    # Click a node: the side panel shows its task, experiments and reports.
    _click_dag_node(page, str(world.nodes["w1"].uuid))
    page.wait_for_selector("#node-panel:not([hidden]) >> text=SFT on clean arithmetic", timeout=WAIT_MS)
    panel = page.inner_text("#node-panel")
    assert "exp_0001" in panel
    assert "exp_0002" in panel
    assert "submitted" in panel
    screenshot(page, "run-page-grown")

    # Guidance: posted pending, then applied by the Main Agent's planning step.
    page.fill("#guidance-form textarea", "Compare DPO with the SFT baseline before scaling.")
    page.click("#guidance-form button[type=submit]")
    pending = page.locator("li.guidance.pending", has_text="Compare DPO with the SFT baseline")
    pending.wait_for(timeout=WAIT_MS)
    # The form empties when the POST answers; the websocket may show the pending item first.
    page.wait_for_function("document.querySelector('#guidance-form textarea').value === ''", timeout=WAIT_MS)
    posted = Guidance.objects.get(text="Compare DPO with the SFT baseline before scaling.")

    def apply_guidance():
        read = guidance_mark_read(run=run)  # the planning step reads the pending guidance...
        applying = decision_record(  # ...and records the decision it took on it
            run=run, kind="verify", trigger="guidance", rationale="the operator asked for a comparison", subject=dpo,
            guidance=[Guidance.objects.get(pk=posted.pk)],
        )  # fmt: skip
        return read, applying

    read, applying = act(apply_guidance)
    assert {g.pk for g in read} == {posted.pk, world.guidance["pending"].pk}

    applied = page.locator("li.guidance.applied", has_text="Compare DPO with the SFT baseline")
    applied.wait_for(timeout=WAIT_MS)
    link = applied.locator("a.decisionref")
    assert link.inner_text() == "decision: verify"
    assert link.get_attribute("href") == f"#decision-{applying.uuid}"
    assert page.inner_text("#decision-count") == "5"
    link.click()
    page.wait_for_selector(f"#decision-{applying.uuid}")
    assert page.evaluate("window.__sameDocument") is True
    _state_equals_fresh_snapshot(page)
    screenshot(page, "run-page-guidance-applied")

    # Pause from the page: the button posts with the CSRF token, the status badge follows.
    page.click("#run-control button[data-action=pause]")
    page.wait_for_selector("#run-status.status-paused", timeout=WAIT_MS)
    assert page.is_disabled("#run-control button[data-action=pause]")
    assert page.is_enabled("#run-control button[data-action=resume]")

    assert page.console_errors == []


def _post_held_back(page, url_glob: str, button: str):  # type: ignore[no-untyped-def]
    """Click ``button`` and hold back the answer of the POST it sends to ``url_glob``: the request
    reaches the server and its answer waits, as on a slow network. Returns (route, answer):
    ``route.fulfill(response=answer)`` lets the page have it."""
    held = []
    page.route(url_glob, lambda route: held.append((route, route.fetch())))
    page.click(button)
    for _ in range(150):
        if held:
            return held[0]
        page.wait_for_timeout(100)  # the route handler runs while Playwright waits
    raise AssertionError(f"the POST to {url_glob} never left the page")


def test_a_late_answer_to_the_guidance_form_does_not_undo_what_the_websocket_brought(transactional_db, live_url, page):
    """The Main Agent can read guidance before the browser has the POST's answer (a real run does,
    tests/e2e/test_live_run_browser.py): the answer, older than the websocket's events, must not
    set the applied item back to pending."""
    world = build_world()
    run = world.run
    text = "Check the tokenizer before any new SFT branch."
    log_in(page, live_url, "operator-person", PASSWORD)
    page.goto(f"{live_url}/runs/{run.uuid}/")
    _wait_live(page)

    page.fill("#guidance-form textarea", text)
    route, answer = _post_held_back(page, "**/guidance/", "#guidance-form button[type=submit]")
    posted = Guidance.objects.get(text=text)

    def apply_guidance():
        guidance_mark_read(run=run)
        return decision_record(run=run, kind="verify", trigger="guidance", rationale="as asked",
                               guidance=[Guidance.objects.get(pk=posted.pk)])  # fmt: skip

    applying = act(apply_guidance)
    applied = page.locator("li.guidance.applied", has_text=text)
    applied.wait_for(timeout=WAIT_MS)  # from the websocket, while the form still waits for its answer
    assert page.input_value("#guidance-form textarea") == text

    assert answer.status == 201
    assert answer.json()["applied_at"] is None  # the older record
    route.fulfill(response=answer)
    page.wait_for_function("document.querySelector('#guidance-form textarea').value === ''", timeout=WAIT_MS)
    page.wait_for_timeout(300)  # a frame or more: what the answer would have drawn is drawn
    assert page.locator("li.guidance.pending", has_text=text).count() == 0
    assert applied.locator("a.decisionref").get_attribute("href") == f"#decision-{applying.uuid}"
    _state_equals_fresh_snapshot(page)
    assert page.console_errors == []


def test_a_late_answer_to_the_run_control_does_not_undo_a_status_the_websocket_brought(
    transactional_db, live_url, page
):
    """Pause from the page, and the run is resumed (by another operator, say) before the browser
    has the pause's answer: the answer, older than the websocket's events, must not show it paused."""
    world = build_world()
    run = world.run
    log_in(page, live_url, "operator-person", PASSWORD)
    page.goto(f"{live_url}/runs/{run.uuid}/")
    _wait_live(page)
    page.wait_for_selector("#run-status.status-running", timeout=WAIT_MS)

    route, answer = _post_held_back(page, "**/control/", "#run-control button[data-action=pause]")
    page.wait_for_selector("#run-status.status-paused", timeout=WAIT_MS)  # from the websocket
    act(run_resume, run=Run.objects.get(pk=run.pk), actor="another operator")
    page.wait_for_selector("#run-status.status-running", timeout=WAIT_MS)

    assert answer.status == 200, answer.text()
    assert answer.json()["status"] == "paused"  # the older record
    route.fulfill(response=answer)
    page.wait_for_timeout(500)  # a frame or more: what the answer would have drawn is drawn
    assert page.locator("#run-status.status-running").count() == 1
    _state_equals_fresh_snapshot(page)
    assert page.console_errors == []


def test_reconnect_resynchronises_from_a_fresh_snapshot(transactional_db, live_url, page):
    world = build_world()
    log_in(page, live_url, "viewer-person", PASSWORD)
    page.goto(f"{live_url}/runs/{world.run.uuid}/")
    _wait_live(page)
    assert page.locator("#guidance-form").count() == 0  # a viewer cannot steer

    # Drop the socket and hold the reconnect, so the next change happens while nobody listens.
    page.evaluate(
        """() => { const s = window.rsiRunSocket; s.__connect = s.connect; s.connect = () => {}; s.socket.close(); }"""
    )
    page.wait_for_selector("body[data-live='reconnecting']", timeout=WAIT_MS)

    act(worker_add, run=world.run, task="missed while offline", predecessors=[])  # its event reaches nobody
    page.wait_for_timeout(300)
    assert _dag_nodes(page) == 4

    page.evaluate("() => { const s = window.rsiRunSocket; s.connect = s.__connect; s.connect(); }")
    page.wait_for_function("window.rsiGraphs.dag.nodes().length === 5", timeout=WAIT_MS)
    _wait_live(page)
    _state_equals_fresh_snapshot(page)
    assert page.console_errors == []


def test_record_pages_open_and_stay_live(transactional_db, live_url, page):
    world = build_world()
    run = world.run
    log_in(page, live_url, "admin-person", PASSWORD)

    page.goto(f"{live_url}/runs/{run.uuid}/experiments/exp_0002/")
    assert "EXPLICIT_VIOLATION" in page.inner_text("#integrity")
    assert page.locator("form.adjudicate").count() == 12  # admins adjudicate every finding
    screenshot(page, "experiment-page")

    page.goto(f"{live_url}/runs/{run.uuid}/reports/{world.report.uuid}/")
    assert "exp_0002 used sealed items" in page.inner_text("main")
    screenshot(page, "report-page")

    page.goto(f"{live_url}/runs/{run.uuid}/integrity/")
    assert page.inner_text("#hacking-rate") == "25.0%"
    assert page.locator("#integrity-matrix tbody tr").count() == 4
    assert page.locator("#integrity-matrix .cell-violation").count() == 1
    screenshot(page, "integrity-page")

    # Adjudicate the one pending finding from the page, with a reason.
    form = page.locator("form.adjudicate").first
    form.locator("select[name=adjudication]").select_option("ALLOWED")
    form.locator("textarea[name=rationale]").fill("Attribution is complete: the claim cites its own evaluation.")
    form.locator("button[type=submit]").click()
    page.wait_for_selector("text=adjudication recorded", timeout=WAIT_MS)
    assert page.locator("form.adjudicate").count() == 0  # nothing left to adjudicate

    job = world.jobs["running"]
    page.goto(f"{live_url}/jobs/{job.uuid}/")
    _wait_live(page)
    assert page.inner_text("#job-progress-text") == "40%"
    act(job_report, job=job, progress=0.7, metrics_point={"step": 30, "loss": 1.25}, log_line="step 30: loss=1.25")
    page.wait_for_function("document.getElementById('job-progress-text').textContent === '70%'", timeout=WAIT_MS)
    assert page.inner_text("#job-log").splitlines()[-1] == "step 30: loss=1.25"
    page.wait_for_selector("#job-metrics-chart .main-svg", timeout=WAIT_MS)
    held, fresh = page.evaluate(
        """async (url) => [JSON.parse(JSON.stringify(window.rsiJobState)), await (await fetch(url)).json()]""",
        f"/jobs/{job.uuid}/snapshot.json",
    )
    assert held == fresh
    assert held["metrics_points"][-1] == {"step": 30, "loss": 1.25}
    # The worker's sampler reports a hardware point (apps.jobs.hardware): the chart and the peaks
    # follow through the job's websocket, without a reload.
    page.evaluate("window.__sameDocument = true")
    assert page.text_content("#hw-peak-ram") == "—"
    gpu = {"index": 0, "util_percent": 97.0, "memory_mib": 7000.0, "memory_total_mib": 81559.0, "temperature_c": 71.0}
    for t, ram in ((0, 800.0), (10, 1234.5)):
        sample = {"t": t, "cpu_percent": 50.0 + t, "ram_mib": ram, "host_ram_percent": 31.0, "gpus": [gpu]}
        act(job_report, job=job, hardware_sample=sample)
        page.wait_for_function("(ram) => document.getElementById('hw-peak-ram').textContent === ram",
                               arg=f"{ram:.1f}", timeout=WAIT_MS)  # fmt: skip
    traces = page.evaluate("document.getElementById('job-hardware-chart').data.map((t) => [t.name, t.x, t.y])")
    assert ["RAM MiB", [0, 10], [800, 1234.5]] in traces
    assert ["CPU %", [0, 10], [50, 60]] in traces
    assert page.text_content("#hw-gpus") == " · GPU 0 peak 7000.0 / 81559.0 MiB"
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "job-page")

    page.goto(f"{live_url}/datapool/")
    page.click("text=data_0001")
    assert world.data.sha256 in page.inner_text("main")
    screenshot(page, "datapool-entry")

    page.goto(f"{live_url}/runs/{run.uuid}/")
    _wait_live(page)
    page.locator("#chart-budget").scroll_into_view_if_needed()  # charts load when on screen
    page.wait_for_selector("body[data-charts='loaded']", timeout=30_000)
    assert page.locator(".chart .main-svg").count() >= 5
    screenshot(page, "run-page-charts")
    assert page.console_errors == []
