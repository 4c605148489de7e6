"""Lets a test read the ``sys.modules`` of a process it started (tests/rsiweb/test_lean_processes.py).

Python's ``site`` imports ``sitecustomize`` at every interpreter start, so a process started with
this folder on PYTHONPATH and ``RSI_MODULES_PROBE_DIR`` set runs the code below, and so does every
process it forks (a Celery prefork pool's children) or execs (``manage.py serve`` execs uvicorn).
Each runs a daemon thread that answers a request file ``<dir>/<pid>.ask`` with ``<dir>/<pid>.json``:
the names in its ``sys.modules`` at that moment. Nothing of this is loaded by a process started
without the variable, and no project code knows of it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

_DIR = os.environ.get("RSI_MODULES_PROBE_DIR")


def _answer(folder: Path) -> None:
    pid = os.getpid()
    ask = folder / f"{pid}.ask"
    while True:
        if ask.exists():
            tmp = folder / f"{pid}.tmp"
            tmp.write_text(json.dumps(sorted(sys.modules)))
            tmp.replace(folder / f"{pid}.json")  # whole or not at all
            ask.unlink()
        time.sleep(0.1)


def _start() -> None:
    if _DIR:
        threading.Thread(target=_answer, args=(Path(_DIR),), name="modules-probe", daemon=True).start()


_start()
os.register_at_fork(after_in_child=_start)
