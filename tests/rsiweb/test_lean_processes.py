"""The web server, the agents worker and the default worker load no ML stack (issue 30, item 3).

The processes are the real ones, started as ``manage.py demo`` starts them (its ``Stack``; the web
server through ``manage.py serve``), the agents pool forking as in compose.yaml. Each one, and
each pool child, is asked for the names in its ``sys.modules`` (tests/support/modules_probe): after
the workers print ``ready.`` (their task modules imported) and after the web server has answered
a request (its URLconf, every view module, imported). The import-linter contract "the web server
and the agents and default workers load no ML stack" holds the same line statically.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from apps.flows.management.commands.demo import Stack
from tests.support.procs import ROOT, child_env
from tests.workers.agents.stack import free_port

PROBE = ROOT / "tests" / "support" / "modules_probe"
HEAVY = ("torch", "transformers", "trl", "peft", "datasets", "vllm")
# What shows the answer came from the process named: its own server or worker framework.
OWN = {"web": "uvicorn", "agents": "celery.worker", "default": "celery.worker"}


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a prefork pool's children)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def modules_of(pid: int, folder: Path, timeout: float = 30) -> list[str]:
    (folder / f"{pid}.ask").touch()
    answer = folder / f"{pid}.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answer.exists():
            return list(json.loads(answer.read_text()))
        time.sleep(0.1)
    raise AssertionError(f"process {pid} did not report its modules within {timeout:.0f} s")


@pytest.mark.django_db
def test_web_agents_and_default_processes_load_no_ml_stack(tmp_path: Path) -> None:
    folder = tmp_path / "modules"
    folder.mkdir()
    env = child_env(
        REDIS_URL=settings.CELERY_BROKER_URL,
        RSI_DATA_DIR=str(tmp_path / "data"),
        RSI_MODULES_PROBE_DIR=str(folder),
        PYTHONPATH=f"{PROBE}:{ROOT}",
    )
    stack = Stack(env=env, log_dir=tmp_path / "logs", port=free_port(), agent_pool="prefork", agent_threads=1)
    stack.overrides = {"web": [sys.executable, "manage.py", "serve", "--port", str(stack.port)]}
    stack.start(("web", "agents", "default"))
    try:
        stack.wait_ready(timeout=180)
        assert httpx.get(f"{stack.url}/healthz", timeout=10).status_code == 200
        loaded: dict[str, list[str]] = {}
        for name, process in stack.processes.items():
            pool = children(process.pid)
            assert name == "web" or pool, f"the {name} worker has no pool child to ask"
            for pid in [process.pid, *pool]:
                modules = modules_of(pid, folder)
                assert OWN[name] in modules, f"{name} ({pid}) answered without {OWN[name]}: not the process meant"
                loaded[f"{name} ({pid})"] = sorted({m.split(".")[0] for m in modules} & set(HEAVY))
        assert {key: heavy for key, heavy in loaded.items() if heavy} == {}
    finally:
        stack.stop()
