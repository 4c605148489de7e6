"""Honest state and re-run with changes (issue 36, items 4-5) in headless Chromium on the real web
server: the run page after its script has applied the live snapshot (an overrun budget, the
accelerator counting the job training now, the flag of a ruled violation, a Stop that cancels the
queued training), and "Re-run with changes" from a run to a new run with one setting changed."""

from __future__ import annotations

import re

import pytest

from apps.flows.runs import run_launch
from apps.jobs.choices import JobStatus
from apps.jobs.models import Job
from apps.research.models import Run
from tests.apps.dashboard.world import PASSWORD, build_world, make_people
from tests.e2e.conftest import log_in, screenshot
from tests.factories import BenchmarkFactory, CheckpointFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
WAIT_MS = 15_000


def test_the_run_page_tells_overruns_live_use_the_flag_and_what_stop_does(transactional_db, live_url, page):
    world = build_world()
    run = world.run
    # 132 % of the accelerator budget with the training that has run for 3 minutes.
    Run.objects.filter(pk=run.pk).update(used_accelerator_seconds=3600 * 1.32 - 180)
    queued = Job.objects.create(run=run, experiment=world.exp["e4"], kind="train", queue="gpu", spec={"recipe": "sft"})
    log_in(page, live_url, "operator-person", PASSWORD)
    page.goto(f"{live_url}/runs/{run.uuid}/")
    page.wait_for_selector("body[data-live='live']", timeout=WAIT_MS)
    accelerator = page.locator("[data-budget='accelerator']")
    assert int(accelerator.locator(".budget-value").inner_text().rstrip("%")) in (132, 133)
    assert "over" in accelerator.get_attribute("class")
    assert page.is_visible("#run-flagged")  # exp_0002's ruled violation, after the script's render too
    assert "queued trainings are cancelled at once" in page.inner_text("#control-help")

    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#run-control button[data-action=stop]")
    page.wait_for_function("document.getElementById('run-status').textContent === 'stopping'", timeout=WAIT_MS)
    queued.refresh_from_db()
    assert queued.status == JobStatus.CANCELLED
    page.reload()
    assert "1 queued job cancelled, 1 let finish" in page.inner_text("#run-stopped")  # the running training
    screenshot(page, "run-honest-state")
    assert page.console_errors == []


def test_re_run_with_changes_from_the_run_page(transactional_db, live_url, page):
    make_people()
    benchmark = BenchmarkFactory(name="test/clone")
    base = CheckpointFactory(is_base=True, handle="test/theta0")
    original = run_launch(benchmark=benchmark, base_checkpoint=base, name="sprint A", start=False, wall_seconds=1800,
                          accelerator_seconds=2400, parallel=3, seed=7, search_policy="uct", max_workers=6,
                          screen_steps=30, train_steps=120, learning_rate=5e-4, batch_size=32)  # fmt: skip
    log_in(page, live_url, "operator-person", PASSWORD)
    page.goto(f"{live_url}/runs/{original.uuid}/")
    page.click("#run-clone")
    page.wait_for_selector("#clone-of", timeout=WAIT_MS)
    values = {field: page.input_value(f"#id_{field}") for field in (
        "wall_seconds", "accelerator_seconds", "parallel", "seed", "search_policy", "max_workers", "screen_steps",
        "train_steps", "learning_rate", "batch_size", "base_checkpoint")}  # fmt: skip
    assert values == {"wall_seconds": "1800", "accelerator_seconds": "2400", "parallel": "3", "seed": "7",
                      "search_policy": "uct", "max_workers": "6", "screen_steps": "30", "train_steps": "120",
                      "learning_rate": "0.0005", "batch_size": "32", "base_checkpoint": "test/theta0"}  # fmt: skip

    page.fill("#id_learning_rate", "0")
    page.click("#run-start-form button[type=submit]")
    page.wait_for_selector(".field[data-field=learning_rate] .field-error", timeout=WAIT_MS)
    assert "must be above 0" in page.inner_text(".field[data-field=learning_rate] .field-error")
    assert Run.objects.count() == 1

    page.fill("#id_learning_rate", "0.0005")
    page.fill("#id_train_steps", "300")
    page.fill("#id_name", "sprint B")
    page.click("#run-start-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/runs/[0-9a-f-]{36}/$"), timeout=WAIT_MS)
    clone = Run.objects.get(name="sprint B")
    assert clone.policy["heuristic"] == {**original.policy["heuristic"], "train_steps": 300}
    assert (clone.budget_wall_seconds, clone.max_parallel_workers, clone.search_policy, clone.policy["seed"]) == (
        1800, 3, "uct", 7)  # fmt: skip
    assert page.console_errors == []
