"""The quiet stop of a running run: it waits for outside harnesses that hold active nodes.

An external-mode run is driven by harnesses calling the REST API with tokens issued by
``manage.py expos_token``. The supervisor's ``run_advance`` stops a run with nothing left to do
after RSI_RUN_QUIET_SECONDS; while a harness holds an active node it stops the run only once
every held node's tokens have been silent for RSI_RUN_SILENT_SECONDS.
"""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command
from django.test import Client

from apps.flows.runs import run_advance, run_start
from apps.research.agent_config import loop_config
from apps.research.choices import AgentMode, RunStatus
from apps.research.models import Run
from tests.factories import make_run

pytestmark = pytest.mark.django_db


def issue_token(run: Run, handle: str) -> str:
    """A token for ``handle``, as an operator issues it to a harness."""
    out = io.StringIO()
    call_command("expos_token", run=str(run.uuid), node=handle, stdout=out)
    return out.getvalue().strip()


def call(token: str, tool: str, body: dict | None = None):
    return Client().post(f"/api/v1/tools/{tool}", data=body or {}, content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip


def harness_with_a_worker() -> Run:
    """An external run whose harness planned through the Main token and holds worker_0001."""
    run = run_start(run=make_run(name="external", agent_mode=AgentMode.EXTERNAL), actor="test")
    main = issue_token(run, "main")
    created = call(main, "state_add_new_worker", {"task": "Direction: data-screen\nCapability: arithmetic"})
    assert created.status_code == 201, created.content
    worker = issue_token(run, created.json()["handle"])
    assert call(worker, "public_check_quota").status_code == 200
    return run


def test_the_silence_limit_defaults_to_thirty_minutes(monkeypatch):
    monkeypatch.delenv("RSI_RUN_SILENT_SECONDS", raising=False)
    assert loop_config().silent_seconds == 1800


def test_a_harness_holding_an_active_node_keeps_the_run_past_the_quiet_time():
    run = harness_with_a_worker()
    # Nothing is queued and no loop of ours is active: the quiet time (0 s) has passed.
    advanced = run_advance(run=run, grace_seconds=60, quiet_seconds=0, silent_seconds=1800)
    assert advanced.status == RunStatus.RUNNING


def test_a_harness_silent_past_the_limit_is_stopped():
    run = harness_with_a_worker()
    time.sleep(1.5)  # the held nodes' tokens say nothing for longer than the limit below
    advanced = run_advance(run=run, grace_seconds=60, quiet_seconds=0, silent_seconds=1)
    assert advanced.status == RunStatus.STOPPING
    reason = advanced.status_changes.order_by("-created_at").first().reason
    assert "main, worker_0001" in reason
    assert "silent" in reason


def test_with_no_harness_attached_the_quiet_time_applies():
    run = run_start(run=make_run(name="external, nobody attached", agent_mode=AgentMode.EXTERNAL), actor="test")
    advanced = run_advance(run=run, grace_seconds=60, quiet_seconds=0, silent_seconds=1800)
    assert advanced.status == RunStatus.STOPPING
    assert "nothing left to do" in advanced.status_changes.order_by("-created_at").first().reason
