"""The run supervisor's quiet-stop rule (run_advance) for external runs, whose agents have no loop of ours."""

from __future__ import annotations

import pytest

from apps.flows.runs import run_advance, run_start
from apps.research.choices import RunStatus
from apps.research.services import worker_add
from tests.factories import make_run


def _external_run(name: str):
    return run_start(run=make_run(name=name, agent_mode="external", max_parallel_workers=1), actor="test")


@pytest.mark.django_db
def test_an_external_run_is_not_stopped_as_quiet_while_its_harness_holds_an_active_worker():
    run = _external_run("harness")
    worker_add(run=run, task="improve addition", predecessors=[], actor="test")
    assert run_advance(run=run, grace_seconds=0, quiet_seconds=0).status == RunStatus.RUNNING


@pytest.mark.django_db
def test_an_external_run_with_no_active_node_and_nothing_running_is_stopped_as_quiet():
    run = _external_run("empty")
    assert run_advance(run=run, grace_seconds=0, quiet_seconds=0).status == RunStatus.STOPPING
