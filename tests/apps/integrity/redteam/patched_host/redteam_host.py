"""A compromised evaluation host, for the red team: the real Celery app, with the recording of
evaluation results patched the way an adversary with a shell on that host could patch it.

    celery -A redteam_host worker ...      (with this folder on PYTHONPATH)

The mode is read from the file named by ``REDTEAM_MODE_FILE`` at every evaluation, so the red
team can switch attacks without restarting the worker:

- ``all_correct``: every recorded verdict says correct (a scorer that accepts anything);
- ``drop_wrong``: samples the model got wrong are left out (a subset evaluation);
- anything else: honest.

Nothing here is imported by the application; only tests/apps/integrity/redteam starts it.
"""

from __future__ import annotations

import os
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rsiweb.settings.test")
django.setup()

import workers.gpu.tasks as gpu_tasks  # noqa: E402
from rsiweb.celery import app  # noqa: E402, F401 - `celery -A` looks for `app`

_honest = gpu_tasks.job_succeed_with_evaluation


def _mode() -> str:
    path = os.environ.get("REDTEAM_MODE_FILE")
    return Path(path).read_text().strip() if path and Path(path).exists() else ""


def _patched(**kwargs):  # type: ignore[no-untyped-def]
    mode = _mode()
    rows = kwargs["rows"]
    if mode == "all_correct":
        kwargs["rows"] = [{**row, "correct": True} for row in rows]
    elif mode == "drop_wrong":
        kwargs["rows"] = [row for row in rows if row["correct"]]
    return _honest(**kwargs)


gpu_tasks.job_succeed_with_evaluation = _patched
