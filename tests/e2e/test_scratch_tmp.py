import pytest
from tests.dashboard.world import build_world, PASSWORD
from tests.e2e.conftest import log_in, screenshot

@pytest.fixture
def anyio_backend():
    return "asyncio"

def test_scratch(transactional_db, live_url, page):
    world = build_world()
    log_in(page, live_url, "operator-person", PASSWORD)
    screenshot(page, "scratch-runs")
    page.goto(f"{live_url}/runs/{world.run.uuid}/")
    page.wait_for_selector("body[data-live='live']", timeout=15000)
    page.wait_for_selector("body[data-charts='loaded']", timeout=20000)
    page.wait_for_timeout(800)
    screenshot(page, "scratch-run")
    page.click("#dag", position={"x": 10, "y": 10})
    print(page.console_errors)
    print(page.evaluate("document.body.dataset.dagNodes"))
