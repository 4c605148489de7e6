"""Helpers to run project code in separate processes against the test database."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.core.procs import Lifeline

__all__ = ["ROOT", "Lifeline", "child_env", "run_python", "sqlite_env", "test_database_url"]

ROOT = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    """The URL of the database pytest-django created, for subprocesses to share it."""
    db = settings.DATABASES["default"]
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    user = db.get("USER") or "postgres"
    return f"postgres://{user}@{host}:{port}/{db['NAME']}"


def child_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = test_database_url()
    env["DJANGO_SETTINGS_MODULE"] = "rsiweb.settings.test"
    env["PYTHONPATH"] = str(ROOT)
    env.update(overrides)
    return env


def sqlite_env(data_dir: Path) -> dict[str, str]:
    """The embedded default (SQLite in ``data_dir``, no PostgreSQL or Redis) for a child process."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(RSI_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="rsiweb.settings.base", PYTHONPATH=str(ROOT))
    return env


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with Django set up; raise with its stderr on failure."""
    prelude = "import django; django.setup()\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + code],
        env=env or child_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"child process failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def scenario_answers(scenario: str, *, sqlite_dir: Path | None = None) -> Any:
    """What ``scenario`` prints last (one JSON line), run on PostgreSQL in this process (the test's
    database), or with ``sqlite_dir`` in a child on a freshly migrated embedded SQLite default.

    For pages that must answer the same on both databases (tests/apps/dashboard/test_run_search.py).
    """
    if sqlite_dir is None:
        out = io.StringIO()
        with redirect_stdout(out):
            exec(scenario, {})  # noqa: S102 - the test's own scenario, shared with the SQLite child
        return json.loads(out.getvalue().strip().splitlines()[-1])
    code = "from django.core.management import call_command\ncall_command('migrate', verbosity=0)\n" + scenario
    made = run_python(code, env=sqlite_env(sqlite_dir), timeout=240)
    return json.loads(made.stdout.strip().splitlines()[-1])
