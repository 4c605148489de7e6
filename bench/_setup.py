"""Shared set-up for benchmarks: a dedicated PostgreSQL database, migrated, Django ready."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def django_on_bench_db(name: str = "rsiweb_bench", *, fresh: bool = True) -> str:
    url = os.environ.get("BENCH_DATABASE_URL", f"postgres://postgres@127.0.0.1:5432/{name}")
    dbname = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    if fresh:
        subprocess.run(["psql", admin, "-qc", f"DROP DATABASE IF EXISTS {dbname}"], check=True)
        subprocess.run(["psql", admin, "-qc", f"CREATE DATABASE {dbname}"], check=True)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-0123456789-0123456789-0123456789")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/12")
    os.environ["DJANGO_SETTINGS_MODULE"] = "rsiweb.settings.base"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    if fresh:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
    return url


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
