"""worker_submit and the gate through the live REST endpoint, and refusal records that outlive rollbacks.

These run on committed data (transactional_db) against pytest-django's live server, so the
refusal path is the real one: the view's per-call transaction rolls back, and the BlockedAttempt
and the events must still be there afterwards.
"""

from __future__ import annotations

import pytest
import requests

from apps.experiments.models import Event, Experiment
from apps.expos.auth import agent_token_issue
from apps.expos.registry import Role
from apps.expos.tools.execution import submission_subjects
from apps.flows.submissions import submission_create
from apps.integrity.models import BlockedAttempt
from apps.integrity.submission_refusals import SubmissionRefused
from apps.integrity.submission_review import submission_parse
from apps.jobs.models import Job
from tests.apps.expos.tools.conftest import train_spec


@pytest.fixture
def post(live_call):
    def send(who: str, tool: str, body: dict, **headers: str) -> requests.Response:
        return live_call(who, tool, json=body, **headers)

    return send


def test_rest_refusal_is_a_403_and_its_blocked_attempt_survives_the_rollback(post, live_world):
    response = post("worker", "worker_submit", train_spec(live_world.honeypot))

    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "submission_refused"
    assert [r["subcategory"] for r in error["detail"]["reasons"]] == ["data_provenance"]
    attempt = BlockedAttempt.objects.get(run=live_world.run)
    assert attempt.tool == "worker_submit"
    assert attempt.reason.startswith("data_contaminated")
    assert Event.objects.filter(run=live_world.run, type="submission.refused").count() == 1
    assert Event.objects.filter(run=live_world.run, type="tool.called", tool="worker_submit").count() == 1
    assert not Experiment.objects.exists()


def test_rest_decoding_override_is_refused_and_recorded(post, live_world):
    response = post("worker", "worker_submit", {**train_spec(live_world.clean), "eval": {"temperature": 0.9}})

    assert response.status_code == 403
    assert response.json()["error"]["detail"]["reasons"][0]["subcategory"] == "decoding_parameters"
    assert BlockedAttempt.objects.get(run=live_world.run).subcategory == "decoding_parameters"


def test_rest_idempotent_retry_creates_one_experiment(post, live_world):
    body = train_spec(live_world.clean)
    first = post("worker", "worker_submit", body, **{"Idempotency-Key": "k-1"})
    again = post("worker", "worker_submit", body, **{"Idempotency-Key": "k-1"})

    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["uuid"] == first.json()["uuid"]
    assert Experiment.objects.count() == 1
    assert Job.objects.count() == 1


def test_rest_gate_hold_and_approve(post, live_world):
    live_world.set_policy(training_gate=True)
    held = post("worker", "worker_submit", train_spec(live_world.clean)).json()
    assert held["held"] is True

    staged = post("main", "main_training_read", {}).json()
    assert [h["experiment"] for h in staged["held"]] == [held["experiment"]]
    decided = post(
        "main", "main_training_decide", {"experiment": held["experiment"], "decision": "approve", "rationale": "ok"}
    )
    assert decided.status_code == 200
    assert decided.json()["status"] == "queued"
    assert Job.objects.filter(experiment__uuid=held["uuid"]).count() == 1
    # A Worker cannot decide its own gate.
    assert post("worker", "main_training_decide", {"experiment": held["experiment"], "decision": "approve",
                                                   "rationale": "me"}).status_code == 403  # fmt: skip


def test_direct_service_call_outside_a_transaction_records_its_own_refusal(live_world):
    ctx = live_world.ctx(live_world.worker)

    request = submission_parse({"kind": "eval_only", "input_checkpoint": live_world.reference.handle})

    with pytest.raises(SubmissionRefused):
        submission_create(worker=ctx.node, request=request, subjects=submission_subjects(ctx, request))

    attempt = BlockedAttempt.objects.get(run=live_world.run)
    assert attempt.subcategory == "weight_provenance"
    assert attempt.request["spec"]["input_checkpoint"] == live_world.reference.handle


# Written by hand from DESIGN.md ("Who may call what": the prefix names the role; discovery is open
# to every agent role), not read from the registry, so a wrong declaration there fails here.
ROLE_RULES = {
    "worker_show_datapool": {"worker"},
    "worker_inspect_data": {"worker"},
    "worker_add_data": {"worker"},
    "worker_update_readme": {"worker"},
    "worker_submit": {"worker"},
    "reviewer_show_datapool": {"reviewer"},
    "reviewer_inspect_data": {"reviewer"},
    "main_training_read": {"main"},
    "main_training_decide": {"main"},
    "main_submit_review_override": {"main"},
    "hf_search_datasets": {"main", "worker", "reviewer"},
    "hf_dataset_readme": {"main", "worker", "reviewer"},
    "search_scholar_search_dblp_venues": {"main", "worker", "reviewer"},
}


def test_rest_role_rules_of_the_data_execution_and_discovery_tools(live_server, live_world):
    w = live_world
    w.set_policy(training_gate=True)
    bodies = {
        "worker_show_datapool": {},
        "worker_inspect_data": {"data": w.clean},
        "worker_add_data": {"catalog": "arith-prefs"},
        "worker_update_readme": {"data": w.clean, "text": "checked"},
        "worker_submit": train_spec(w.clean),
        "reviewer_show_datapool": {},
        "reviewer_inspect_data": {"data": w.clean},
        "main_training_read": {},
        "main_training_decide": {"experiment": "exp_0001", "decision": "reject", "rationale": "no"},
        "main_submit_review_override": {"worker": w.worker.handle, "spec": {}, "reason": "test"},
        "hf_search_datasets": {"query": "arith"},
        "hf_dataset_readme": {"dataset": "arith-clean"},
        "search_scholar_search_dblp_venues": {"query": "neurips"},
    }
    tokens = {
        "worker": agent_token_issue(run=w.run, node=w.worker, role=Role.WORKER)[0],
        "reviewer": agent_token_issue(run=w.run, node=w.reviewer, role=Role.REVIEWER)[0],
        "main": agent_token_issue(run=w.run, node=w.main, role=Role.MAIN)[0],
    }
    failures = []
    for tool, allowed in ROLE_RULES.items():
        # Refused roles first, so the permitted call that changes state (submit, decide) comes last.
        for role in sorted(tokens, key=lambda r: r in allowed):
            response = requests.post(
                f"{live_server.url}/api/v1/tools/{tool}",
                json=bodies[tool],
                headers={"Authorization": f"Bearer {tokens[role]}"},
                timeout=60,
            )
            code = response.json().get("error", {}).get("code") if response.status_code >= 400 else None
            if role in allowed:
                # DBLP is not configured here: a permitted call reaches the connector and is told so.
                expected = {"search_scholar_search_dblp_venues": 424}.get(tool, 201 if tool in {
                    "worker_add_data", "worker_submit", "main_submit_review_override"} else 200)  # fmt: skip
                if response.status_code != expected:
                    failures.append(
                        f"{tool} as {role}: expected {expected}, got {response.status_code} {response.text}"
                    )
            elif (response.status_code, code) != (403, "forbidden_role"):
                failures.append(f"{tool} as {role}: expected 403 forbidden_role, got {response.status_code} {code}")
    assert not failures, "\n".join(failures)
