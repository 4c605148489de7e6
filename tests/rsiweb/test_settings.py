"""Settings come from the environment; production refuses to start without a secret key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.procs import ROOT

PRINT = (
    "from django.conf import settings as s; print(s.DATABASES['default']['ENGINE'], "
    "s.CELERY_BROKER_URL.split(':')[0], s.CHANNEL_LAYERS['default']['BACKEND'])"
)


def settings_in(env_overrides: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG")}
    env.update(DJANGO_SETTINGS_MODULE="rsiweb.settings.base", RSI_DATA_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    env.update(env_overrides)
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + PRINT],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_embedded_default_needs_no_server_and_generates_a_key(tmp_path):
    result = settings_in({}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["django.db.backends.sqlite3", "sqla+sqlite", "apps.live.layers.SQLiteChannelLayer"]
    key = (tmp_path / "secret_key").read_text()
    assert len(key) >= 50
    assert oct((tmp_path / "secret_key").stat().st_mode)[-3:] == "600"
    # The same install keeps its key.
    settings_in({}, tmp_path)
    assert (tmp_path / "secret_key").read_text() == key


def test_services_are_used_when_configured(tmp_path):
    result = settings_in(
        {"DATABASE_URL": "postgres://u@db:5432/x", "REDIS_URL": "redis://r:6379/0", "SECRET_KEY": "k" * 50}, tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["django.db.backends.postgresql", "redis", "apps.live.layers.RedisChannelLayer"]


def test_production_without_secret_key_refuses_to_start(tmp_path):
    result = settings_in({"DATABASE_URL": "postgres://u@db:5432/x"}, tmp_path)
    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr


def test_malformed_boolean_is_named(tmp_path):
    result = settings_in({"DEBUG": "maybe"}, tmp_path)
    assert result.returncode != 0
    assert "DEBUG='maybe' is not a boolean" in result.stderr
