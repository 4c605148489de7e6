"""End-to-end fixtures: the real web server (uvicorn, as `manage.py serve`) on the test database, the
real research stack, and Chromium.

``live_url``: a uvicorn subprocess serving rsiweb.asgi as production does (websockets through the
real channels_redis layer, static files from WhiteNoise), pointed at the test database by
DATABASE_URL. Tests change state by calling services in this process; the server and the
browser see only what was committed, so the tests use ``transactional_db``.

``research_stack``: the processes ``manage.py demo`` starts (web server, Celery workers on the
gpu, agents and default queues) on the test database with the built minibench installed and
the agents suite's short loop timings (tests/workers/agents/stack.py), for a real heuristic run.

Every process started here dies with the test process, however it ends (tests/support/procs.py
``Lifeline``).

The browser is Debian's Chromium (/usr/bin/chromium, installed by ./dev test), driven by
Playwright for Python; nothing is downloaded at test time.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.db import connection
from playwright.sync_api import sync_playwright

from apps.core.management.commands.serve import uvicorn_command
from tests.support.procs import Lifeline
from tests.workers.agents import stack as support

# Playwright's sync API keeps an event loop on the test's thread; Django would then refuse the
# test's own (synchronous) ORM calls as if they came from async code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(
    database_name: str | None,
    *,
    log_path: Path,
    settings_module: str = "rsiweb.settings.test",
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """Start the web server (``manage.py serve``'s uvicorn) on a free port against ``database_name``,
    or, with ``env`` (tests.support.procs.sqlite_env), as that environment says (the embedded default).

    The server leads a process group of its own, for the caller's Lifeline.
    """
    db = settings.DATABASES["default"]
    port = _free_port()
    if env is not None:
        env = {**env, "RSI_LOG_LEVEL": "WARNING"}
    else:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings_module,
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{database_name}",
            "RSI_LOG_LEVEL": "WARNING",
        }
    log = log_path.open("w")
    process = subprocess.Popen(
        uvicorn_command(host="127.0.0.1", port=port),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the web server exited with {process.returncode}: {log_path.read_text()[-3000:]}")
        try:
            if requests.get(f"{base}/healthz", timeout=1).status_code == 200:
                return process, base
        except requests.RequestException:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the web server did not answer within 60 s: {log_path.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def live_url(django_db_setup, django_db_blocker, tmp_path_factory):
    """Base URL of a web server on the test database, for the whole session."""
    process, base = start_server(
        settings.DATABASES["default"]["NAME"], log_path=tmp_path_factory.mktemp("web") / "web.log"
    )
    lifeline = Lifeline([process.pid])
    yield base
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
    lifeline.close()


@pytest.fixture(scope="module")
def research_stack(django_db_setup, django_db_blocker, tmp_path_factory):
    """web + gpu/agents/default Celery workers on the test database, the built minibench installed.

    Per module: only the real-run test needs it, and its workers should not outlive that test's
    module. The test re-installs the minibench (``support.install``) inside its own transactional
    test, since a flush between tests removes the rows. Its workers read this suite's Redis
    queues: a session that also holds tests/workers/agents' stack would have two stacks on one broker with
    different artifact roots, which is why tests/run_suites.py gives each suite folder a session.
    """
    minibench = support.minibench_root(tmp_path_factory)
    base = tmp_path_factory.mktemp("research-stack")
    roots = support.roots_for(base, minibench)
    saved = {key: getattr(settings, key) for key in roots if hasattr(settings, key)}
    support.apply_roots(roots)
    support.flush_broker()
    stack = support.make_stack(roots=roots, log_dir=base / "logs")
    stack.start()  # its processes are tied to this one by the Stack's own Lifeline
    try:
        stack.wait_ready()
        stack.minibench = minibench  # type: ignore[attr-defined]
        yield stack
    finally:
        stack.stop()
        support.flush_broker()
        for key in roots:
            if key in saved:
                setattr(settings, key, saved[key])
            else:
                delattr(settings, key)


@pytest.fixture(scope="module")
def browser():
    # Per module, not per session: Playwright's sync API keeps an event loop running in this
    # thread until it stops, and async tests collected after the browser tests in the same
    # session (``pytest tests/e2e tests/apps/dashboard``: the consumer tests under anyio) would
    # fail with "Cannot run the event loop while another loop is running".
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (./dev test does).")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class ConsoleErrors(list):
    """Console errors and uncaught exceptions of a page, for the 'no console errors' checks."""

    def watch(self, page) -> None:
        page.on("console", lambda message: self.append(f"console: {message.text}") if message.type == "error" else None)
        page.on("pageerror", lambda error: self.append(f"pageerror: {error}"))


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    page.console_errors = ConsoleErrors()
    page.console_errors.watch(page)
    yield page
    context.close()


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def log_in(page, base: str, username: str, password: str) -> None:
    """Sign in through the login form, as a person would."""
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def act(function, *args, **kwargs):
    """Run a service call (and what it publishes) on a thread of its own and return its result.

    Playwright's sync API keeps an asyncio loop on the test's thread, and Django refuses
    synchronous database work beside a running loop. The thread opens its own database
    connection; with transactional_db its commits are what the server sees.
    """

    def call():
        try:
            return function(*args, **kwargs)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result(timeout=120)
