"""The researcher's workbench in headless Chromium (issue 36, items 1-3), on the real web server.

Runs made through the real services (tests/apps/dashboard/workbench_world.py): a viewer sorts the
runs table by the final score, queries it by value, is told clearly what is wrong with a bad query,
ticks two runs that stay ticked while a new run arrives, exports the selection as CSV, overlays
their training curves (step then time axis, smoothing), reads a run's experiments as a table with
parallel coordinates, and downloads a checkpoint file from the run's artifacts page.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from tests.apps.dashboard.workbench_world import build_workbench
from tests.apps.dashboard.world import PASSWORD, make_people
from tests.e2e.conftest import log_in, screenshot
from tests.factories import make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
WAIT_MS = 15_000


def _listed(page) -> list[str]:
    return page.eval_on_selector_all(
        "table.runs tbody tr", "rows => rows.map(r => r.querySelector('.run-name a').textContent)"
    )


def test_find_sort_query_select_export_overlay_and_download(transactional_db, live_url, page, tmp_path):
    make_people()
    bench = build_workbench(tmp_path)
    log_in(page, live_url, "viewer-person", PASSWORD)

    # Sort by the final-split score (its CI beside it), descending on the first click.
    final = page.locator(f"tr[data-run='{bench.low.uuid}'] td[data-col='final']").inner_text()
    assert final.startswith("0.700 [")
    page.click("th[data-col='final'] a")
    page.wait_for_url("**sort=-final**")
    assert _listed(page) == ["sweep low lr", "sweep high lr", "still running"]

    # A query by value, then a bad one: a clear message, no rows.
    page.fill("#run-query", "final > 0.5 and lr < 1e-3")
    page.click("#run-filters button[type=submit]")
    page.wait_for_url("**query=**")
    assert _listed(page) == ["sweep low lr"]
    page.fill("#run-query", "final > 0.5 and")
    page.click("#run-filters button[type=submit]")
    page.wait_for_selector("#run-list-error")
    assert "query: expected a column name, found 'the end'" in page.inner_text("#run-list-error")
    assert _listed(page) == []
    screenshot(page, "workbench-bad-query")

    # The selection holds while a run streams in.
    page.goto(f"{live_url}/")
    page.check(f"tr[data-run='{bench.low.uuid}'] input[name=runs]")
    page.check(f"tr[data-run='{bench.high.uuid}'] input[name=runs]")
    newcomer = make_run(name="newcomer", benchmark=bench.low.benchmark, base_checkpoint=bench.low.base_checkpoint)
    page.reload()
    page.wait_for_selector("body[data-selection='ready']")
    assert page.is_checked(f"tr[data-run='{bench.low.uuid}'] input[name=runs]")
    assert page.is_checked(f"tr[data-run='{bench.high.uuid}'] input[name=runs]")
    assert not page.is_checked(f"tr[data-run='{newcomer.uuid}'] input[name=runs]")
    assert page.inner_text("#selected-count") == "2"
    with page.expect_download() as download:
        page.click("#export-selected-csv")
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text(encoding="utf-8"))))
    assert sorted(row["name"] for row in rows) == ["sweep high lr", "sweep low lr"]
    assert {row["hp.learning_rate"] for row in rows} == {"0.0001", "0.002"}

    # Overlaid training curves of the two runs: step axis, time axis, smoothing.
    page.click("#curves-button")
    page.wait_for_selector("body[data-curves='3']", timeout=WAIT_MS)
    steps = page.evaluate("document.getElementById('curves-chart').data.map(t => t.x.at(-1))")
    assert steps == [50, 80, 50]
    page.select_option("#curve-axis", "elapsed_s")
    page.wait_for_function("document.getElementById('curves-chart').data[1].x.at(-1) === 40", timeout=WAIT_MS)
    page.eval_on_selector(".chart-smoothing", "el => { el.value = '0.6'; el.dispatchEvent(new Event('input')); }")
    page.wait_for_function("document.getElementById('curves-chart').data.length === 6", timeout=WAIT_MS)
    screenshot(page, "workbench-curves")

    # A run's experiments: a sortable table of recipes with parallel coordinates.
    page.goto(f"{live_url}/runs/{bench.low.uuid}/")
    page.click("#experiments-table-link")
    page.wait_for_selector("body[data-parcoords='loaded']", timeout=WAIT_MS)
    page.click("th[data-col='hp.learning_rate'] a")
    page.wait_for_url("**sort=**")
    order = page.eval_on_selector_all("#experiments-table tbody tr", "rows => rows.map(r => r.dataset.experiment)")
    assert order == ["exp_0002", "exp_0001"]  # 3e-4 before 1e-4
    page.check("tr[data-experiment='exp_0001'] input[name=exp]")
    page.click("#experiment-curves-button")
    page.wait_for_selector("body[data-curves='1']", timeout=WAIT_MS)

    # Artifacts: a checkpoint's file downloads; the sealed reference is not there.
    page.goto(f"{live_url}/runs/{bench.low.uuid}/")
    page.click("#artifacts-link")
    trained = bench.experiments["low/exp_0001"].output_checkpoint
    assert bench.low.benchmark.reference_checkpoint.handle not in page.content()
    page.click(f"details[data-checkpoint='{trained.handle}'] summary")
    with page.expect_download() as download:
        page.click(f"details[data-checkpoint='{trained.handle}'] a.download[href$='model.safetensors']")
    assert Path(download.value.path()).read_bytes() == b"weights of sweep low lr exp_0001"
    screenshot(page, "workbench-artifacts")

    # The bad query's 400 is the only console complaint.
    assert [e for e in page.console_errors if "400" not in e] == []
