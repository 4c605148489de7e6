"""The researcher's workbench (issue 36, items 1-5) in headless Chromium on the demo's default
database: the embedded SQLite, its Celery broker and channel layer, no PostgreSQL or Redis.

The other browser tests run on the test PostgreSQL; this module serves one SQLite world for all its
checks. A child process migrates a fresh embedded default in a temporary folder and builds the
workbench runs through the real services (tests/apps/dashboard/workbench_world.py), tags two of
them and sets the running one's accelerator use past its budget; a second web server
(``manage.py serve``'s uvicorn) runs on that folder. Everything else is done in the browser: the
search, tag, status and date filters (search and tags once answered 500 on SQLite), sort and chosen
columns, a query by value and a bad one, both exports of a selection, overlaid curves, a run's
experiments table with parallel coordinates, the overrun and Stop on a running run, "clone this
run" with one change, and the configuration diff of the original and its clone.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.apps.dashboard.world import PASSWORD
from tests.e2e.conftest import log_in, screenshot, start_server
from tests.support.procs import Lifeline, run_python, sqlite_env

pytestmark = pytest.mark.slow
WAIT_MS = 20_000

WORLD = """
import json
from pathlib import Path
from django.core.management import call_command
call_command("migrate", verbosity=0)
from apps.research.models import Run
from apps.research.services import run_label
from tests.apps.dashboard.workbench_world import build_workbench
from tests.apps.dashboard.world import make_people

make_people()
bench = build_workbench(Path({tmp!r}))
run_label(run=bench.low, actor="user:test", tags=["lr-sweep", "Demo"])
run_label(run=bench.high, actor="user:test", tags=["lr-sweep"])
# The running run has spent 132 % of its accelerator budget (as test_honest_browser sets it).
Run.objects.filter(pk=bench.running.pk).update(used_accelerator_seconds=3600 * 1.32)
print(json.dumps({{"low": str(bench.low.uuid), "high": str(bench.high.uuid), "running": str(bench.running.uuid)}}))
"""


@pytest.fixture(scope="module")
def sqlite_site(tmp_path_factory) -> Iterator[tuple[str, dict[str, str]]]:
    """(base URL, run uuids) of a web server on a fresh embedded SQLite default with the workbench world."""
    data = tmp_path_factory.mktemp("sqlite-site")
    env = sqlite_env(data / "var")
    built = run_python(WORLD.format(tmp=str(data / "world")), env=env, timeout=300)
    runs = json.loads(built.stdout.strip().splitlines()[-1])
    process, base = start_server(None, log_path=data / "web.log", env=env)
    lifeline = Lifeline([process.pid])
    try:
        yield base, runs
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        lifeline.close()


def _listed(page) -> list[str]:
    return page.eval_on_selector_all(
        "table.runs tbody tr", "rows => rows.map(r => r.querySelector('.run-name a').textContent)"
    )


def test_find_sort_query_and_export_on_sqlite(sqlite_site, page):
    base, runs = sqlite_site
    log_in(page, base, "viewer-person", PASSWORD)
    assert sorted(_listed(page)) == ["still running", "sweep high lr", "sweep low lr"]

    # Search (a name holding the text, or a tag equal to it), then a tag badge's link.
    page.fill("#id_q", "demo")
    page.click("#run-filters button[type=submit]")
    page.wait_for_url("**q=demo**")
    assert _listed(page) == ["sweep low lr"]
    page.goto(f"{base}/")
    page.click(f"tr[data-run='{runs['high']}'] a.badge.tag")
    page.wait_for_url("**tag=lr-sweep**")
    assert sorted(_listed(page)) == ["sweep high lr", "sweep low lr"]

    # Status and date filters.
    page.goto(f"{base}/")
    page.select_option("#id_status", "running")
    page.click("#run-filters button[type=submit]")
    page.wait_for_url("**status=running**")
    assert _listed(page) == ["still running"]
    page.goto(f"{base}/?created_before=2000-01-01")
    assert _listed(page) == []
    page.goto(f"{base}/?created_after=2000-01-01")
    assert len(_listed(page)) == 3

    # Choose a parameter as a column, sort by the final score.
    page.goto(f"{base}/")
    page.click("#column-chooser summary")
    page.check("#column-chooser input[value='hp.learning_rate']")
    page.click("#run-filters button[type=submit]")
    page.wait_for_selector("th[data-col='hp.learning_rate']")
    assert page.inner_text(f"tr[data-run='{runs['high']}'] td[data-col='hp.learning_rate']") == "0.002"
    page.click("th[data-col='final'] a")
    page.wait_for_url("**sort=-final**")
    assert _listed(page) == ["sweep low lr", "sweep high lr", "still running"]
    assert page.inner_text(f"tr[data-run='{runs['low']}'] td[data-col='final']").startswith("0.700 [")

    # A query by value, then a bad one: a clear message and no rows.
    page.fill("#run-query", "final > 0.5 and lr < 1e-3")
    page.click("#run-filters button[type=submit]")
    page.wait_for_url("**query=**")
    assert _listed(page) == ["sweep low lr"]
    page.fill("#run-query", "final >")
    page.click("#run-filters button[type=submit]")
    page.wait_for_selector("#run-list-error")
    assert "query:" in page.inner_text("#run-list-error")
    assert _listed(page) == []

    # The selection's exports, CSV and Parquet.
    page.goto(f"{base}/")
    page.check(f"tr[data-run='{runs['low']}'] input[name=runs]")
    page.check(f"tr[data-run='{runs['high']}'] input[name=runs]")
    with page.expect_download() as download:
        page.click("#export-selected-csv")
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text(encoding="utf-8"))))
    assert sorted((row["name"], row["hp.learning_rate"]) for row in rows) == [
        ("sweep high lr", "0.002"), ("sweep low lr", "0.0001")]  # fmt: skip
    with page.expect_download() as download:
        page.click("#export-selected-parquet")
    table = pq.read_table(download.value.path()).to_pylist()
    assert sorted(row["name"] for row in table) == ["sweep high lr", "sweep low lr"]
    screenshot(page, "sqlite-runs")
    assert [e for e in page.console_errors if "400" not in e] == []


def test_curves_and_experiments_table_on_sqlite(sqlite_site, page):
    base, runs = sqlite_site
    log_in(page, base, "viewer-person", PASSWORD)
    page.check(f"tr[data-run='{runs['low']}'] input[name=runs]")
    page.check(f"tr[data-run='{runs['high']}'] input[name=runs]")
    page.click("#curves-button")
    page.wait_for_selector("body[data-curves='3']", timeout=WAIT_MS)
    assert page.evaluate("document.getElementById('curves-chart').data.map(t => t.x.at(-1))") == [50, 80, 50]
    page.select_option("#curve-axis", "elapsed_s")
    page.wait_for_function("document.getElementById('curves-chart').data[1].x.at(-1) === 40", timeout=WAIT_MS)

    page.goto(f"{base}/runs/{runs['low']}/")
    page.click("#experiments-table-link")
    page.wait_for_selector("body[data-parcoords='loaded']", timeout=WAIT_MS)
    page.click("th[data-col='hp.learning_rate'] a")
    page.wait_for_url("**sort=**")
    order = page.eval_on_selector_all("#experiments-table tbody tr", "rows => rows.map(r => r.dataset.experiment)")
    assert order == ["exp_0002", "exp_0001"]
    screenshot(page, "sqlite-experiments")
    assert page.console_errors == []


def test_honest_state_clone_and_config_diff_on_sqlite(sqlite_site, page):
    base, runs = sqlite_site
    log_in(page, base, "operator-person", PASSWORD)

    # The running run: its accelerator overrun drawn past 100 %; Stop (written by the server into SQLite).
    page.goto(f"{base}/runs/{runs['running']}/")
    page.wait_for_selector("body[data-live='live']", timeout=WAIT_MS)
    accelerator = page.locator("[data-budget='accelerator']")
    assert accelerator.locator(".budget-value").inner_text() == "132%"
    assert "over" in accelerator.get_attribute("class")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#run-control button[data-action=stop]")
    page.wait_for_function("document.getElementById('run-status').textContent === 'stopping'", timeout=WAIT_MS)
    page.reload()
    assert page.inner_text("#run-status") == "stopping"

    # Clone the finished low-lr run with one change; the start form refuses a bad value first.
    page.goto(f"{base}/runs/{runs['low']}/")
    page.click("#run-clone")
    page.wait_for_selector("#clone-of", timeout=WAIT_MS)
    learning_rate = page.input_value("#id_learning_rate")
    assert page.input_value("#id_parallel") == "2"  # the run's max parallel Workers (make_run's default)
    page.fill("#id_learning_rate", "0")
    page.click("#run-start-form button[type=submit]")
    page.wait_for_selector(".field[data-field=learning_rate] .field-error", timeout=WAIT_MS)
    assert "must be above 0" in page.inner_text(".field[data-field=learning_rate] .field-error")
    page.fill("#id_learning_rate", learning_rate)
    page.fill("#id_train_steps", "300")
    page.fill("#id_name", "low lr, longer")
    page.click("#run-start-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/runs/[0-9a-f-]{36}/$"), timeout=WAIT_MS)
    clone = page.url.rstrip("/").rsplit("/", 1)[1]
    assert page.inner_text("h1").strip().startswith("low lr, longer")

    # Only the differences between the original and its clone.
    page.goto(f"{base}/runs/compare/?runs={runs['low']}&runs={clone}")
    keys = page.eval_on_selector_all("#config tr[data-key]", "rows => rows.map(r => r.dataset.key)")
    assert "policy.heuristic.train_steps" in keys, keys
    assert page.locator("#config tr[data-key='policy.heuristic.train_steps'] td").all_inner_texts()[-1] == "300"
    assert "benchmark" not in keys  # the same benchmark: not a difference
    screenshot(page, "sqlite-clone-diff")
    assert page.console_errors == []
