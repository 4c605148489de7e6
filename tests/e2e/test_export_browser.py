"""Export then import in headless Chromium (issue 15, point 8): an operator downloads a finished run's
bundle from its page, it is imported into an empty instance, and that instance's web server shows
the same run with its chain verifying.

The run is the dashboard tests' finished world on a benchmark registered from real sealed items
(tests/support/bundles.py), ended through the real services; no research run is trained here.
The empty instance is a fresh database migrated and written by child ``manage.py`` processes
(``import_run``, ``verify_events``), served by a second web server of its own.
"""

from __future__ import annotations

import pytest

from apps.flows.bundle import bundle_read
from apps.flows.scores import run_scores
from tests.apps.dashboard.world import PASSWORD
from tests.e2e.conftest import act, log_in, screenshot, start_server
from tests.support.bundles import empty_instance, manage, sealed_finished_world
from tests.support.procs import Lifeline

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
IMPORTED_ADMIN = ("imported-admin", "pw-imported-123")


def test_a_run_exported_from_its_page_imports_into_an_empty_instance(
    transactional_db, live_url, page, settings, tmp_path
):
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    world, _ = act(sealed_finished_world, tmp_path)
    run = world.run
    scores = act(run_scores, run=run)

    # The operator's download, from the run page's link.
    log_in(page, live_url, "operator-person", PASSWORD)
    page.goto(f"{live_url}/runs/{run.uuid}/")
    with page.expect_download() as download:
        page.click("#run-export")
    assert download.value.suggested_filename.endswith(".zip")
    path = tmp_path / "bundle.zip"
    download.value.save_as(path)
    bundle = bundle_read(path)
    assert bundle["run"] == str(run.uuid)
    events = len(bundle["tables"]["experiments.event"])
    assert events > 0

    with empty_instance(tmp_path / "instance") as instance:
        imported = manage(instance, "import_run", str(path))
        assert imported.returncode == 0, imported.stderr[-3000:]
        verified = manage(instance, "verify_events", "--run", str(run.uuid))
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert f"chain {run.uuid}: OK ({events + 1} events)" in verified.stdout  # and the run.imported event
        user, password = IMPORTED_ADMIN
        create = (
            "from django.contrib.auth.models import User; "
            f"User.objects.create_superuser({user!r}, password={password!r})"
        )
        made = manage(instance, "shell", "-c", create)
        assert made.returncode == 0, made.stderr[-3000:]

        # The other instance's own web server and a browser context of its own (no shared cookies).
        server, base = start_server(instance["RSI_TEST_INSTANCE_DB"], log_path=tmp_path / "imported-web.log")
        lifeline = Lifeline([server.pid])
        try:
            there = page.context.browser.new_context(viewport={"width": 1440, "height": 1000})
            other = there.new_page()
            errors: list[str] = []
            other.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            other.on("pageerror", lambda e: errors.append(str(e)))
            log_in(other, base, user, password)
            other.goto(f"{base}/runs/{run.uuid}/")
            assert other.inner_text("h1").strip().startswith(run.name)
            assert other.inner_text("#result-checkpoint") == scores.returned_checkpoint
            assert other.inner_text("#result-raw") == f"{scores.raw.score:.3f}"
            assert other.inner_text("#result-theta0") == f"{scores.theta0.score:.3f}"
            assert other.inner_text("#result-reference") == f"{scores.reference.score:.3f}"
            screenshot(other, "imported-run")
            other.click("#result-integrity")
            other.wait_for_selector("#integrity-matrix")
            assert "exp_0002" in other.inner_text("#integrity-matrix")
            assert errors == []
            there.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
            lifeline.close()
    assert page.console_errors == []
