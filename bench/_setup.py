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


def minibench_stack_folders(default_dir: str) -> tuple[str, Path]:
    """The built minibench ($RSI_MINIBENCH_CACHE) and the bench's own stack folders, exported.

    Artifacts, sealed copies, workspaces and the data folder go under $BENCH_DIR (else
    `default_dir`), so a bench never writes into a checkout's var/. Returns the minibench and that folder.
    """
    cache = os.environ.get("RSI_MINIBENCH_CACHE")
    if not cache or not (Path(cache) / "manifest.json").exists():
        sys.exit("set RSI_MINIBENCH_CACHE to a built ci minibench (manage.py build_minibench --profile ci --out DIR)")
    base = Path(os.environ.get("BENCH_DIR", default_dir))
    os.environ.update(RSI_ARTIFACT_ROOT=str(base / "artifacts"), RSI_SEALED_ROOT=str(base / "sealed"),
                      RSI_WORKSPACE_ROOT=str(base / "workspaces"), RSI_MINIBENCH_ROOT=cache,
                      RSI_DATA_DIR=str(base / "data"))  # fmt: skip
    return cache, base


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
