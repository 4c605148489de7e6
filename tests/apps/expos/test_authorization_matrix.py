"""The authorization matrix, written by hand from DESIGN.md's role rules — not from the registry.

If a tool's declared roles drift from the design (say, a Worker could call stop_loop), the
expectations below still say what the design says and the test fails.

Principals: main; own = the Worker that owns the target records; other = another Worker;
rin / rout = a Reviewer whose scope does / does not own them; viewer = a person's session;
anon = no credentials. Expectations are an HTTP status and, for refusals, the error code.
Refused principals are called first, so a permitted call that changes state comes last.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from apps.experiments.models import Event
from apps.expos.registry import load_all
from tests.apps.expos.conftest import PRINCIPALS, World

OK, CREATED = 200, 201
ROLE = (403, "forbidden_role")
ANON = (401, None)
HIDDEN = (404, None)
PEOPLE = {"viewer": ROLE, "anon": ANON}


def only(allowed: dict[str, Any]) -> dict[str, Any]:
    """Everyone not named is refused by role (agents, viewer) or unauthenticated (anon)."""
    out = {p: ROLE for p in PRINCIPALS if p not in allowed}
    out.update(PEOPLE)
    out.update(allowed)
    return out


def agents(**allowed: Any) -> dict[str, Any]:
    return {**PEOPLE, **allowed}


ALL_AGENTS_OK = agents(main=OK, own=OK, other=OK, rin=OK, rout=OK)

# tool -> (body from the world, expectations per principal)
MATRIX: dict[str, tuple[Callable[[World], dict[str, Any]], dict[str, Any]]] = {
    # --- execution & state: main_* / state_* are the Main Agent's ---------------------------
    "state_add_new_worker": (lambda w: {"task": "a new hypothesis"}, only({"main": CREATED})),
    "state_get_current_worker": (lambda w: {}, only({"own": OK, "other": OK})),
    "state_get_current_main": (lambda w: {}, only({"main": OK})),
    "state_get_current_reviewer": (lambda w: {}, only({"rin": OK, "rout": OK})),
    "state_inspect_worker": (lambda w: {"worker": w.nodes["own"].handle}, only({"main": OK})),
    "state_finalize_worker": (lambda w: {"worker": w.nodes["own"].handle, "reason": "enough"}, only({"main": OK})),
    "worker_finalize": (
        lambda w: {"summary": "done", "experiments": [w.exp["own1"].handle]},
        only({"own": OK, "other": (409, "foreign_experiment")}),
    ),
    "state_sync_results": (lambda w: {}, ALL_AGENTS_OK),
    "events_tail": (lambda w: {"limit": 10}, ALL_AGENTS_OK),
    "stop_loop": (lambda w: {"reason": "budget spent"}, only({"main": OK})),
    "public_check_quota": (lambda w: {}, ALL_AGENTS_OK),
    "run_result_policy": (lambda w: {}, ALL_AGENTS_OK),
    "main_nominate_result": (
        # The world's experiments are pending review: none can be nominated yet.
        lambda w: {"experiment": w.exp["own1"].handle, "rationale": "best", "evidence": [w.exp["own1"].handle]},
        only({"main": (409, "not_accepted")}),
    ),
    # --- research & evidence --------------------------------------------------------------------
    "main_optimizer_read": (lambda w: {}, only({"main": OK})),
    "main_optimizer_update": (
        lambda w: {"claims": [{"key": "lr", "text": "lower lr helps", "evidence": [w.exp["own2"].handle]}]},
        only({"main": CREATED}),
    ),
    "research_candidates_read": (lambda w: {}, ALL_AGENTS_OK),
    "worker_propose_candidate": (lambda w: {"title": "distil from θ0"}, only({"own": CREATED, "other": CREATED})),
    "main_prediction_read": (lambda w: {}, only({"main": OK})),
    "main_prediction_bind_worker": (
        lambda w: {"worker": w.nodes["successor"].handle, "text": "beats own by 2 points", "expected_value": 0.02},
        only({"main": CREATED}),
    ),
    "main_prediction_reconcile": (
        lambda w: {"prediction": str(w.prediction.uuid), "verdict": "refuted", "note": "exp_0002: +20 points"},
        only({"main": OK}),
    ),
    # Reviewer-level detail: per-sample rows of its scope only; elsewhere they are sealed.
    "compare_eval_samples": (
        lambda w: {"a": str(w.evals["own1"].uuid), "b": str(w.evals["own2"].uuid)},
        only({"rin": OK, "rout": (403, "sealed")}),
    ),
    # --- review management ----------------------------------------------------------------------
    "reviewer_inspect_experiment": (
        lambda w: {"experiment": w.exp["own1"].handle},
        only({"rin": OK, "rout": (403, "out_of_scope")}),
    ),
    "reviewer_submit_review": (
        lambda w: {"summary": "sound", "experiments": [w.exp["own1"].handle]},
        only({"rin": CREATED, "rout": (400, "out_of_scope")}),
    ),
    "reviewer_finalize": (lambda w: {}, only({"rin": OK, "rout": (409, "no_report")})),
    "inspect_reviewer_report": (
        lambda w: {"reviewer": w.nodes["rin"].handle},
        only({"main": OK, "rin": OK, "rout": (403, "not_your_report")}),
    ),
    # --- ours -------------------------------------------------------------------------------------
    "state_add_new_reviewer": (
        lambda w: {"question": "is own sound?", "scope": [w.nodes["own"].handle]},
        only({"main": CREATED}),
    ),
    "main_guidance_read": (lambda w: {}, only({"main": OK})),
    # Read tools: every agent role, within its visibility (other / rout cannot see own's records).
    "get_lineage": (
        lambda w: {"experiment": w.exp["own2"].handle},
        agents(main=OK, own=OK, other=HIDDEN, rin=OK, rout=HIDDEN),
    ),
    "job_status": (
        lambda w: {"job": str(w.jobs["own_train"].uuid)},
        agents(main=OK, own=OK, other=HIDDEN, rin=OK, rout=HIDDEN),
    ),
    "job_hardware": (
        lambda w: {"job": str(w.jobs["own_train"].uuid)},
        agents(main=OK, own=ROLE, other=ROLE, rin=OK, rout=HIDDEN),
    ),
    "job_logs": (
        lambda w: {"job": str(w.jobs["own_train"].uuid)},
        agents(main=OK, own=OK, other=HIDDEN, rin=OK, rout=HIDDEN),
    ),
    "training_curve_read": (
        lambda w: {"job": str(w.jobs["own_train"].uuid)},
        agents(main=OK, own=OK, other=HIDDEN, rin=OK, rout=HIDDEN),
    ),
    "compare_experiments": (
        lambda w: {"a": w.exp["own1"].handle, "b": w.exp["own2"].handle},
        agents(main=OK, own=OK, other=HIDDEN, rin=OK, rout=HIDDEN),
    ),
    # Agent-logged metrics: a Worker writes on its own experiments only; reading follows visibility.
    "experiment_log_metrics": (
        lambda w: {"experiment": w.exp["own2"].handle, "points": [{"key": "rows_kept", "step": 1, "value": 0.5}]},
        only({"own": OK, "other": HIDDEN}),
    ),
    "experiment_metrics_read": (
        lambda w: {"experiment": w.exp["own2"].handle, "key": "rows_kept"},
        agents(main=OK, own=OK, other=HIDDEN, rin=OK, rout=HIDDEN),
    ),
    # Job control: a Worker cancels its own jobs, the Main any; Reviewers never act.
    "cancel_job": (
        lambda w: {"job": str(w.jobs["own_running"].uuid)},
        only({"main": OK, "own": OK, "other": HIDDEN}),
    ),
}

# The order permitted calls are made in, after every refused one.
ORDER = ("anon", "viewer", "rout", "other", "rin", "own", "main")


def test_matrix_covers_every_tool_of_this_slice():
    """Every research/review/state/ours tool of the registry has a hand-written row (and no extra rows)."""
    registry = load_all()
    mine = {n for n, t in registry.items() if t.category in ("research_evidence", "review_management", "rsiweb")}
    mine |= {n for n, t in registry.items() if t.category == "execution_state"} - {
        "worker_submit",
        "main_training_read",
        "main_training_decide",
        "main_submit_review_override",
    }
    assert set(MATRIX) == mine


def _ordered(expectations: dict[str, Any]) -> list[str]:
    refused = [p for p in ORDER if isinstance(expectations[p], tuple)]
    permitted = [p for p in ORDER if not isinstance(expectations[p], tuple)]
    return refused + permitted


def _check(api, world, tool_name: str) -> list[str]:
    body_for, expectations = MATRIX[tool_name]
    assert set(expectations) == set(PRINCIPALS)
    tool = load_all()[tool_name]
    output = jsonschema.Draft202012Validator(tool.output_schema, format_checker=jsonschema.FormatChecker())
    failures = []
    for who in _ordered(expectations):
        expected = expectations[who]
        response = api.call(who, tool_name, body_for(world))
        body = response.json()
        if isinstance(expected, tuple):
            status, code = expected
            if response.status_code != status or (code and body["error"]["code"] != code):
                failures.append(f"{tool_name} {who}: expected {status} {code}, got {response.status_code} {body}")
        elif response.status_code != expected:
            failures.append(f"{tool_name} {who}: expected {expected}, got {response.status_code} {body}")
        else:
            errors = [e.message for e in output.iter_errors(body)]
            if errors:
                failures.append(f"{tool_name} {who}: answer violates the output schema: {errors[:3]}")
    # Every agent call, permitted or refused, left a tool.called event with the tool's name.
    agent_calls = sum(1 for p in PRINCIPALS if p not in ("viewer", "anon"))
    recorded = Event.objects.filter(run=world.run, type="tool.called", tool=tool_name).count()
    if recorded != agent_calls:
        failures.append(f"{tool_name}: {recorded} tool.called events for {agent_calls} agent calls")
    return failures


# Tools whose permitted calls change nothing another row depends on: one world serves them all
# (each database flush costs seconds). The others get a fresh world each.
READS = (
    "state_get_current_worker",
    "state_get_current_main",
    "state_get_current_reviewer",
    "state_inspect_worker",
    "state_sync_results",
    "events_tail",
    "public_check_quota",
    "run_result_policy",
    "main_optimizer_read",
    "research_candidates_read",
    "main_prediction_read",
    "compare_eval_samples",
    "reviewer_inspect_experiment",
    "inspect_reviewer_report",
    "get_lineage",
    "job_status",
    "job_logs",
    "job_hardware",
    "training_curve_read",
    "compare_experiments",
    "experiment_metrics_read",
)


def test_role_matrix_read_tools(api, world):
    failures = [failure for name in READS for failure in _check(api, world, name)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("tool_name", sorted(set(MATRIX) - set(READS)))
def test_role_matrix_changing_tools(api, world, tool_name):
    failures = _check(api, world, tool_name)
    assert not failures, "\n".join(failures)
