"""Run bundles under test: a finished run on real sealed items, and an empty instance to import into.

Shared by the bundle tests (tests/apps/dashboard/test_export.py) and the browser test of export
then import (tests/e2e/test_export_browser.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from django.db import connection

from apps.benchmarks.services import benchmark_register
from apps.experiments.anchors import instance_public_key
from apps.experiments.models import EvaluationSample
from tests.apps.benchmarks.minibench_fixture import TASK_JSON, write_jsonl
from tests.apps.dashboard.world import build_world, finish_world
from tests.factories import CheckpointFactory
from tests.support.procs import ROOT


def sealed_items(split: str, n: int) -> list[dict[str, str]]:
    # Words that occur nowhere else, so a plain text search of the bundle finds any leak.
    return [
        {"id": f"{split}-{i:04d}", "prompt": f"Sealed question {split} {i}: what follows zq{i}x?",
         "answer": f"answer-{split}-zq{i}x"}
        for i in range(n)
    ]  # fmt: skip


def sealed_finished_world(task_root: Path, *, people: Any = None) -> tuple[Any, list[dict[str, str]]]:
    """The dashboard's finished world on a benchmark registered from real sealed items.

    ``settings.SEALED_ROOT`` must point somewhere writable (the caller's tmp folder); the task
    folder is written under ``task_root``. Returns the world and every sealed item.
    """
    task = task_root / "task"
    task.mkdir(parents=True)
    (task / "task.json").write_text(json.dumps(TASK_JSON), encoding="utf-8")
    feedback, final = sealed_items("feedback", 8), sealed_items("final", 20)
    write_jsonl(task / "feedback.jsonl", feedback)
    write_jsonl(task / "final.jsonl", final)
    benchmark = benchmark_register(
        name="test/export", task_dir=task, reference_checkpoint=CheckpointFactory(is_reference=True)
    )
    world = build_world(people=people, benchmark=benchmark)
    # The dashboard world's own per-sample rows: a Reviewer-visible output that is a sealed answer.
    EvaluationSample.objects.create(
        evaluation=world.evals["e1"], sample_id=feedback[0]["id"], output=feedback[0]["answer"], correct=True
    )
    world.run = finish_world(world, final_items=final)
    return world, feedback + final


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py <args>`` in a child process with ``env`` (an instance of its own)."""
    return subprocess.run(
        [sys.executable, "manage.py", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def table_count(url: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # noqa: S608 - test's own names


@contextmanager
def empty_instance(data_dir: Path) -> Iterator[dict[str, str]]:
    """A fresh database on the test server, migrated by a child: an empty rsiweb instance.

    Yields the instance's environment (``DATABASE_URL``, ``RSI_DATA_DIR``, settings) and its
    database name under ``RSI_TEST_INSTANCE_DB``; the database is dropped afterwards.
    """
    params = connection.settings_dict
    server = f"postgres://{params['USER']}@{params['HOST'] or '127.0.0.1'}:{params['PORT'] or 5432}"
    name = f"rsiweb_import_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    env = {**os.environ, "DATABASE_URL": f"{server}/{name}", "RSI_DATA_DIR": str(data_dir)}
    # It trusts this process's instance key, as an operator configures the instance a bundle comes from.
    env["RSI_TRUSTED_INSTANCE_KEYS"] = instance_public_key()
    env.update(DJANGO_SETTINGS_MODULE="rsiweb.settings.test", PYTHONPATH=str(ROOT), RSI_TEST_INSTANCE_DB=name)
    try:
        migrated = manage(env, "migrate", "-v0")
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        yield env
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
