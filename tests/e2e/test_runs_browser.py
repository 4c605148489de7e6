"""Runs compared, a run started from the form, and every page offline, in headless Chromium.

Two finished runs (tests/apps/dashboard/compare_world.py: real services plus the evaluation
rows a finished run leaves) are ticked on the runs list and compared: config diff, best-so-far
curves drawn by the vendored plotly, final scores and the paired bootstrap on shared sample ids.
An operator starts a run from the form, through the service ``manage.py start_run`` calls, and
lands on its page (test_live_run_browser.py watches a run started by that service finish).
The offline check blocks and records every request that would leave loopback, on every
dashboard page and the API docs, and fails on any of them or on a console error.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from apps.research.choices import RunStatus
from apps.research.models import Run
from tests.apps.dashboard.compare_world import DIFFERENCE, SHARED, build_pair
from tests.apps.dashboard.world import PASSWORD, build_world, make_people
from tests.e2e.conftest import log_in, screenshot
from tests.factories import BenchmarkFactory, CheckpointFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
WAIT_MS = 15_000
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
LOCAL_SCHEMES = {"data", "blob", "about"}


def test_two_runs_compared_side_by_side(transactional_db, live_url, page):
    make_people()
    pair = build_pair()
    log_in(page, live_url, "viewer-person", PASSWORD)
    page.check(f"tr[data-run='{pair.a.uuid}'] input[name=runs]")
    page.check(f"tr[data-run='{pair.b.uuid}'] input[name=runs]")
    page.click("#compare-button")
    page.wait_for_url(f"{live_url}/runs/compare/**")

    assert page.locator("#config tr[data-key]").count() == 4  # only the differences
    assert page.locator("#config tr[data-key='policy.reviewers'] td").all_inner_texts()[1:] == ["True", "False"]
    assert page.locator("#final-scores .final-score").all_inner_texts() == ["0.500", "0.750"]
    pair_row = page.locator("#paired tr.pair")
    assert pair_row.locator(".n-common").inner_text() == str(SHARED)
    assert pair_row.locator(".difference").inner_text() == f"{DIFFERENCE:.3f}"
    low, high = (float(x) for x in pair_row.locator(".paired-ci").inner_text().strip("[]").split(","))
    assert 0 < low < DIFFERENCE < high
    page.wait_for_selector("body[data-charts='loaded']", timeout=WAIT_MS)
    traces = page.evaluate("document.getElementById('compare-curves').data.map(t => [t.name, t.y])")
    assert traces == [["1. full, seed 0", [0.3, 0.45, 0.45]], ["2. no reviewer, seed 1", [0.5, 0.5]]]
    screenshot(page, "runs-compare")

    page.click("#config-toggle")
    page.wait_for_selector("#config tr[data-key='benchmark']", timeout=WAIT_MS)
    assert page.locator("#config tr[data-key]").count() > 4

    page.goto(f"{live_url}/")
    page.click("#ablation-link")
    page.wait_for_selector(".ablation-group", timeout=WAIT_MS)
    assert page.eval_on_selector_all(".arm", "arms => arms.map(a => a.dataset.arm)") == ["full", "no-reviewer"]
    assert page.locator(".arm .arm-mean").all_inner_texts() == ["0.500", "0.750"]
    assert page.console_errors == []


def test_operator_starts_a_run_from_the_form(transactional_db, live_url, page):
    people = make_people()
    benchmark = BenchmarkFactory(name="test/form")
    CheckpointFactory(is_base=True, handle="test/theta0")
    log_in(page, live_url, "operator-person", PASSWORD)
    page.click("#start-run-link")
    page.fill("#id_name", "started from the browser")
    page.fill("#id_wall_seconds", "30")
    page.check("#id_serial_workers")
    page.click("#run-start-form button[type=submit]")
    page.wait_for_selector(".field[data-field=parallel] .field-error", timeout=WAIT_MS)
    assert "set max parallel Workers to 1" in page.inner_text(".field[data-field=parallel] .field-error")
    assert "greater than or equal to 60" in page.inner_text(".field[data-field=wall_seconds] .field-error")
    assert Run.objects.count() == 0

    page.fill("#id_wall_seconds", "900")
    page.fill("#id_parallel", "1")
    page.fill("#id_seed", "5")
    page.click("#run-start-form button[type=submit]")
    page.wait_for_url(f"{live_url}/runs/*-*/", timeout=WAIT_MS)
    run = Run.objects.get()
    assert page.url == f"{live_url}/runs/{run.uuid}/"
    page.wait_for_selector("body[data-live='live']", timeout=WAIT_MS)
    assert page.inner_text("#run-status") == "running"
    assert (run.name, run.benchmark, run.status, run.created_by) == (
        "started from the browser",
        benchmark,
        RunStatus.RUNNING,
        people["operator"],
    )
    assert (run.policy["serial_workers"], run.policy["seed"], run.max_parallel_workers) == (True, 5, 1)
    assert page.console_errors == []


def _leaves_loopback(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme not in LOCAL_SCHEMES and (parts.hostname or "") not in LOOPBACK


def test_every_page_and_the_api_docs_load_offline(transactional_db, live_url, page):
    world = build_world()
    pair = build_pair()
    attempted: list[str] = []
    outside: list[str] = []
    page.on("request", lambda request: attempted.append(request.url))
    page.on("websocket", lambda socket: attempted.append(socket.url))

    def offline(route):
        # As on a machine without a network: anything for another host fails, and is recorded.
        if _leaves_loopback(route.request.url):
            outside.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    page.context.route("**/*", offline)
    log_in(page, live_url, "admin-person", PASSWORD)
    run = world.run.uuid
    pages = {
        "runs": "/",
        "runs filtered": "/?q=sprint&status=running",
        "start": "/runs/new/",
        "compare": f"/runs/compare/?runs={pair.a.uuid}&runs={pair.b.uuid}",
        "ablation": "/runs/ablation/",
        "experiment": f"/runs/{run}/experiments/exp_0002/",
        "report": f"/runs/{run}/reports/{world.report.uuid}/",
        "integrity": f"/runs/{run}/integrity/",
        "job": f"/jobs/{world.jobs['running'].uuid}/",
        "datapool": "/datapool/",
        "data entry": "/datapool/data_0001/",
    }
    for name, path in pages.items():
        response = page.goto(f"{live_url}{path}")
        assert response is not None, name
        assert response.ok, name
        page.wait_for_load_state("load")
        if name == "compare":
            page.wait_for_selector("body[data-charts='loaded']", timeout=WAIT_MS)  # plotly drew

    page.goto(f"{live_url}/runs/{run}/")
    page.wait_for_selector("body[data-live='live']", timeout=WAIT_MS)
    page.locator("#chart-budget").scroll_into_view_if_needed()  # charts load when on screen
    page.wait_for_selector("body[data-charts='loaded']", timeout=30_000)

    page.goto(f"{live_url}/api/v1/docs/")
    page.wait_for_selector("#redoc-container h1", timeout=60_000)  # Redoc rendered the schema
    assert "rsiweb ExpOS API" in page.inner_text("#redoc-container h1")

    assert outside == []
    assert all(not _leaves_loopback(url) for url in attempted)
    assert any("/static/drf_spectacular_sidecar/redoc/" in url for url in attempted)
    assert any("/static/vendor/plotly/" in url for url in attempted)
    assert page.console_errors == []
