"""What the state, research, review and job tools do to the records (in-process client, one transaction
per test — the live-server tests cover the HTTP surface)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, transaction
from django.test import Client
from jsonschema import Draft202012Validator

from apps.experiments.models import Evaluation, Event, Experiment, MetricPoint
from apps.expos.payloads import decision_refused
from apps.expos.registry import REGISTRY, Category, Role, load_all, tool
from apps.flows.runs import run_final_eval_start
from apps.integrity.models import FindingChange, IntegrityFinding
from apps.integrity.selectors import hacking_rate
from apps.integrity.services import integrity_check_reports
from apps.jobs.models import Job, JobLogLine
from apps.research.models import (
    Candidate,
    Decision,
    Guidance,
    OptimizerClaim,
    Prediction,
    ResearchEdge,
    ResearchNode,
    Run,
)
from apps.reviews.models import ReviewReport
from tests.apps.expos.conftest import World, build_world


@pytest.fixture
def w(db) -> World:
    return build_world()


def call(world: World, who: str, name: str, body: dict[str, Any] | None = None, **headers: str) -> Any:
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return Client().post(
        f"/api/v1/tools/{name}",
        data=body or {},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {world.tokens[who]}",
        **extra,
    )


def test_spawning_workers_respects_the_limit_and_links_context(w):
    w.run.max_parallel_workers = 4  # own, other, successor are active
    w.run.save(update_fields=["max_parallel_workers"])
    spawned = call(w, "main", "state_add_new_worker", {"task": "t", "predecessors": ["worker_0001", "worker_0002"]})
    assert spawned.status_code == 201
    node = ResearchNode.objects.get(run=w.run, handle=spawned.json()["handle"])
    upstream = set(ResearchEdge.objects.filter(downstream=node).values_list("upstream__handle", "kind"))
    assert upstream == {("worker_0001", "context"), ("worker_0002", "context")}
    full = call(w, "main", "state_add_new_worker", {"task": "one too many"})
    assert full.status_code == 409
    assert full.json()["error"]["code"] == "worker_limit"
    unknown = call(w, "main", "state_add_new_worker", {"task": "t", "predecessors": ["worker_0099"]})
    assert unknown.status_code == 404


def test_worker_finalize_cites_own_experiments_and_wakes_the_main_agent(w):
    missing = call(w, "own", "worker_finalize", {"summary": "done"})
    assert missing.status_code == 409  # own has experiments: the records make the citation necessary
    assert missing.json()["error"]["code"] == "citation_required"
    done = call(w, "own", "worker_finalize", {"summary": "lr matters", "experiments": ["exp_0002", "exp_0001"]})
    assert done.status_code == 200
    assert done.json()["status"] == "finalized"
    assert done.json()["summary_experiments"] == ["exp_0001", "exp_0002"]
    # The world's guidance woke the Main Agent first; the finalize is the latest trigger.
    trigger = Event.objects.filter(run=w.run, type="main.triggered").latest("seq")
    assert trigger.arguments["trigger"] == "worker_finalize"
    assert trigger.arguments["node"] == "worker_0001"
    again = call(w, "own", "worker_finalize", {"summary": "again", "experiments": ["exp_0001"]})
    assert again.json()["error"]["code"] == "node_not_active"


def test_guidance_read_marks_it_applied_and_a_decision_binds_it(w):
    first = call(w, "main", "main_guidance_read").json()["guidance"]
    assert [g["uuid"] for g in first] == [str(w.guidance.uuid)]
    assert Guidance.objects.get(pk=w.guidance.pk).applied_at is not None
    assert call(w, "main", "main_guidance_read").json()["guidance"] == []
    decision = {
        "kind": "branch",
        "trigger": "guidance",
        "rationale": "the operator asked for a smaller lr",
        "subject": "worker_0001",
        "guidance": [str(w.guidance.uuid)],
    }
    recorded = call(w, "main", "main_optimizer_update", {"decision": decision})
    assert recorded.status_code == 201
    assert recorded.json()["decision"]["guidance"] == [str(w.guidance.uuid)]
    assert Guidance.objects.get(pk=w.guidance.pk).applied_decision == Decision.objects.get(run=w.run)
    twice = call(w, "main", "main_optimizer_update", {"decision": decision})
    assert twice.json()["error"]["code"] == "guidance_already_applied"
    assert Decision.objects.filter(run=w.run).count() == 1  # the refused one rolled back
    empty = call(w, "main", "main_optimizer_update", {})
    assert empty.status_code == 400


def test_claims_keep_their_revision_history(w):
    for text in ("lr 1e-4 is best", "lr 3e-5 is best"):
        assert call(w, "main", "main_optimizer_update", {"claims": [{"key": "lr", "text": text}]}).status_code == 201
    read = call(w, "main", "main_optimizer_read", {"history": True}).json()
    (claim,) = read["claims"]
    assert claim["revision"] == 2
    assert claim["text"] == "lr 3e-5 is best"
    assert [h["text"] for h in claim["history"]] == ["lr 1e-4 is best"]
    assert OptimizerClaim.objects.filter(run=w.run, key="lr").count() == 2


def test_predictions_bind_before_results_and_reconcile_once(w):
    late = call(
        w, "main", "main_prediction_bind_worker", {"worker": "worker_0001", "prediction": str(w.prediction.uuid)}
    )
    assert late.json()["error"]["code"] == "branch_already_ran"  # own already has results
    bound = call(
        w, "main", "main_prediction_bind_worker", {"worker": "worker_0003", "prediction": str(w.prediction.uuid)}
    )
    assert bound.status_code == 201
    assert bound.json()["worker"] == "worker_0003"
    rebind = call(
        w, "main", "main_prediction_bind_worker", {"worker": "worker_0003", "prediction": str(w.prediction.uuid)}
    )
    assert rebind.json()["error"]["code"] == "prediction_bound"
    body = {"prediction": str(w.prediction.uuid), "verdict": "confirmed", "observed_value": 0.06, "note": "exp_0005"}
    reconciled = call(w, "main", "main_prediction_reconcile", body)
    assert reconciled.json()["verdict"] == "confirmed"
    assert call(w, "main", "main_prediction_reconcile", body).json()["error"]["code"] == "prediction_reconciled"
    listed = call(w, "main", "main_prediction_read", {"worker": "worker_0003"}).json()["predictions"]
    assert [p["verdict"] for p in listed] == ["confirmed"]
    assert Prediction.objects.get(pk=w.prediction.pk).reconciled_at is not None


def test_candidates_are_open_to_every_agent(w):
    call(w, "other", "worker_propose_candidate", {"title": "mixup", "description": "mix two datasets"})
    for who in ("main", "own", "rin"):
        titles = {c["title"] for c in call(w, who, "research_candidates_read").json()["candidates"]}
        assert titles == {"curriculum by length", "mixup"}
    assert Candidate.objects.get(title="mixup").proposer.handle == "worker_0002"


def test_reviews_submit_finalize_and_wake_the_main_agent(w):
    observation = {
        "experiment": "exp_0002",
        "subcategory": "sample_inclusion",
        "observation": "NOT_FOUND_FULL",
        "evidence": {"sample_ids": ["s0012"]},
    }
    submitted = call(
        w, "rin", "reviewer_submit_review", {"summary": "consistent", "regressions": [], "observations": [observation]}
    )
    assert submitted.status_code == 201
    report = ReviewReport.objects.get(uuid=submitted.json()["uuid"])
    assert set(report.experiments.values_list("handle", flat=True)) == {"exp_0002"}
    finalized = call(w, "rin", "reviewer_finalize")
    assert finalized.json()["status"] == "finalized"
    assert set(ReviewReport.objects.filter(reviewer=w.nodes["rin"]).values_list("status", flat=True)) == {"finalized"}
    triggers = Event.objects.filter(run=w.run, type="main.triggered").order_by("seq")
    assert [e.arguments["trigger"] for e in triggers] == ["guidance", "review_report"]  # the world's guidance first
    assert call(w, "rin", "reviewer_submit_review", {"summary": "late"}).json()["error"]["code"] == "node_not_active"


def test_a_reviewer_adjudicates_findings_of_its_scope_through_its_report(w):
    finding = IntegrityFinding.objects.create(
        experiment=w.exp["own1"],
        subcategory="metric_attribution",
        observation="EXECUTED",
        evidence={"codes": ["score_above_record"], "summary": "states 0.9, recorded 0.37"},
    )
    IntegrityFinding.objects.create(experiment=w.exp["other"], subcategory="metric_attribution", observation="EXECUTED")
    judged = {
        "experiment": "exp_0001",
        "subcategory": "metric_attribution",
        "observation": "EXECUTED",
        "adjudication": "EXPLICIT_VIOLATION",
        "rationale": "the summary states 0.9; the record says 0.37",
    }
    # Outside the scope, without a rationale, or on a finding not yet checked: refused, nothing stored.
    outside = call(w, "rout", "reviewer_submit_review", {"summary": "s", "observations": [judged]})
    assert outside.json()["error"]["code"] == "out_of_scope"
    unexplained = {k: v for k, v in judged.items() if k != "rationale"}
    refused = call(w, "rin", "reviewer_submit_review", {"summary": "s", "observations": [unexplained]})
    assert refused.json()["error"]["code"] == "rationale_required"
    unchecked = {**judged, "subcategory": "data_provenance"}
    assert call(w, "rin", "reviewer_submit_review", {"summary": "s", "observations": [unchecked]}).status_code == 409
    assert not ReviewReport.objects.filter(reviewer=w.nodes["rin"], summary="s").exists()
    assert call(w, "main", "reviewer_submit_review", {"summary": "s", "observations": [judged]}).status_code == 403

    submitted = call(w, "rin", "reviewer_submit_review", {"summary": "inflated score", "observations": [judged]})

    assert submitted.status_code == 201, submitted.json()
    assert submitted.json()["adjudications"] == [
        {
            "experiment": "exp_0001",
            "subcategory": "metric_attribution",
            "observation": "EXECUTED",
            "adjudication": "EXPLICIT_VIOLATION",
            "decided_by": w.nodes["rin"].handle,
            "integrity_status": "flagged",
        }
    ]
    finding.refresh_from_db()
    assert (finding.adjudication, finding.decided_by) == ("EXPLICIT_VIOLATION", w.nodes["rin"].handle)
    assert "manual_observation" not in finding.evidence  # it confirmed the check's observation
    assert FindingChange.objects.filter(finding=finding, actor=w.nodes["rin"].handle).count() == 1
    assert Event.objects.filter(run=w.run, type="integrity.adjudicated", actor=w.nodes["rin"].handle).exists()


def test_a_reviewer_sees_and_adjudicates_the_false_claims_of_a_worker_of_its_scope(w):
    own = w.nodes["own"].handle
    finalized = call(
        w, "own", "worker_finalize", {"summary": "exp_0001 reaches 0.95 on feedback.", "experiments": ["exp_0001"]}
    )
    assert finalized.status_code == 200, finalized.json()
    integrity_check_reports(run=w.run, authors=[own])  # the report check's task body, run on commit
    [listed] = call(w, "rin", "state_get_current_reviewer").json()["report_findings"]
    assert (listed["node"], listed["subcategory"], listed["observation"]) == (own, "metric_attribution", "EXECUTED")
    assert listed["evidence"]["codes"] == ["score_above_record"]
    assert call(w, "rout", "state_get_current_reviewer").json()["report_findings"] == []  # not its scope
    judged = {
        "node": own,
        "subcategory": "metric_attribution",
        "observation": "EXECUTED",
        "adjudication": "EXPLICIT_VIOLATION",
        "rationale": "the summary states 0.95; exp_0001 recorded 0.37",
    }
    # Outside the scope, naming both an experiment and a Worker, the Main Agent, or a finding not
    # stored: refused, nothing stored.
    outside = call(w, "rout", "reviewer_submit_review", {"summary": "s", "observations": [judged]})
    assert outside.json()["error"]["code"] == "out_of_scope"
    both = call(
        w, "rin", "reviewer_submit_review", {"summary": "s", "observations": [{**judged, "experiment": "exp_0001"}]}
    )
    assert (both.status_code, both.json()["error"]["code"]) == (400, "invalid_observation")
    main = call(w, "rin", "reviewer_submit_review", {"summary": "s", "observations": [{**judged, "node": "main"}]})
    assert main.status_code == 400
    unchecked = {**judged, "subcategory": "data_provenance"}
    assert call(w, "rin", "reviewer_submit_review", {"summary": "s", "observations": [unchecked]}).status_code == 409
    assert not ReviewReport.objects.filter(reviewer=w.nodes["rin"], summary="s").exists()

    submitted = call(
        w, "rin", "reviewer_submit_review", {"summary": "the summary overstates", "observations": [judged]}
    )

    assert submitted.status_code == 201, submitted.json()
    rin = w.nodes["rin"].handle
    assert submitted.json()["adjudications"] == [
        {"node": own, "subcategory": "metric_attribution", "observation": "EXECUTED",
         "adjudication": "EXPLICIT_VIOLATION", "decided_by": rin}
    ]  # fmt: skip
    assert submitted.json()["observations"][0]["node"] == own
    finding = IntegrityFinding.objects.get(node=w.nodes["own"], subcategory="metric_attribution")
    assert (finding.adjudication, finding.decided_by, finding.experiment) == ("EXPLICIT_VIOLATION", rin, None)
    assert FindingChange.objects.filter(finding=finding, actor=rin).count() == 1
    assert Event.objects.filter(type="integrity.adjudicated", actor=rin, arguments__node=own).exists()
    # The cited experiment's own record is left alone: the false claim is its author's.
    assert w.exp["own1"].integrity_status == Experiment.objects.get(pk=w.exp["own1"].pk).integrity_status
    rates = hacking_rate(runs=Run.objects.filter(pk=w.run.pk))
    assert (rates["false_reports"], rates["hacked"]) == (1, 0)


def test_add_reviewer_for_all_completed_workers(w):
    none_yet = call(w, "main", "state_add_new_reviewer", {"question": "audit", "scope": "all_completed"})
    assert none_yet.json()["error"]["code"] == "empty_scope"
    call(w, "other", "worker_finalize", {"summary": "s", "experiments": ["exp_0003"]})
    made = call(w, "main", "state_add_new_reviewer", {"question": "audit", "scope": "all_completed"})
    assert made.status_code == 201
    assert made.json()["scope"] == ["worker_0002"]


def test_stop_loop_guards(w):
    assert call(w, "main", "stop_loop", {"reason": "enough"}).json()["run_status"] == "stopping"
    assert call(w, "main", "stop_loop", {"reason": "again"}).json()["run_status"] == "stopping"  # idempotent
    run_final_eval_start(run=w.run)  # what the supervisor does next
    pending = call(w, "main", "stop_loop", {"reason": "now"})
    assert pending.status_code == 409
    assert pending.json()["error"]["code"] == "final_eval_pending"


def test_job_tools_read_logs_curves_and_cancel(w):
    JobLogLine.objects.create(job=w.jobs["own_train"], seq=2, text="step 2 loss 2.0")
    logs = call(w, "own", "job_logs", {"job": str(w.jobs["own_train"].uuid), "after_seq": 1}).json()
    assert [line["text"] for line in logs["lines"]] == ["step 2 loss 2.0"]
    assert logs["last_seq"] == 2
    curve = call(w, "own", "training_curve_read", {"experiment": "exp_0001"}).json()
    assert curve["points"] == [{"step": 1, "metrics": {"loss": 2.5}}, {"step": 2, "metrics": {"loss": 2.0}}]
    status = call(w, "own", "job_status", {"experiment": "exp_0001"}).json()["jobs"]
    assert [j["kind"] for j in status] == ["train", "evaluate"]
    not_train = call(w, "own", "training_curve_read", {"job": str(w.jobs["own_eval"].uuid)})
    assert not_train.json()["error"]["code"] == "not_a_training_job"
    successor_cancel = call(w, "successor", "cancel_job", {"job": str(w.jobs["own_running"].uuid)})
    assert successor_cancel.json()["error"]["code"] == "not_your_job"  # it may see the job, not stop it
    cancelled = call(w, "own", "cancel_job", {"job": str(w.jobs["own_running"].uuid), "reason": "diverged"})
    assert cancelled.json()["cancel_requested"] is True
    assert Job.objects.get(pk=w.jobs["own_running"].pk).cancel_requested


def test_sync_results_records_a_missed_transition(w):
    running = w.exp["own_running"]
    # A missed transition is what no service leaves (the job engine advances the experiment in the
    # job's own transaction): the rows of a crash between the two, written directly.
    Job.objects.filter(pk=w.jobs["own_running"].pk).update(status="succeeded")
    evaluate = Job.objects.create(run=w.run, experiment=running, kind="evaluate", queue="gpu", status="succeeded")
    Evaluation.objects.create(
        run=w.run, experiment=running, checkpoint=running.input_checkpoint, benchmark=w.run.benchmark, job=evaluate,
        split="feedback", score=20 / 30, correct=20, sample_count=30, evaluator_sha256="e" * 64,
        settings_sha256="s" * 64, data_sha256="d" * 64,
    )  # fmt: skip
    synced = call(w, "own", "state_sync_results").json()
    assert synced["changed"] == [{"experiment": running.handle, "from": "running", "to": "succeeded"}]
    running.refresh_from_db()
    assert running.feedback_score == Evaluation.objects.get(job=evaluate).score
    assert call(w, "own", "state_sync_results").json()["changed"] == []  # idempotent
    assert call(w, "other", "state_sync_results").json()["changed"] == []  # not other's to see


def test_an_output_schema_violation_is_a_logged_500_and_rolls_back(w):
    @tool(
        "test_broken_output",
        category=Category.OURS,
        roles={Role.WORKER},
        description="test only",
        output_schema={"type": "object", "additionalProperties": False},
    )
    def broken(ctx, args):
        Candidate.objects.create(run=ctx.run, proposer=ctx.node, title="must not survive")
        return {"undeclared": True}

    try:
        response = call(w, "own", "test_broken_output")
    finally:
        del REGISTRY["test_broken_output"]
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert not Candidate.objects.filter(title="must not survive").exists()
    assert Event.objects.get(run=w.run, tool="test_broken_output").arguments["error"] == "internal_error"


def test_openapi_documents_every_tool_with_its_schemas_and_errors(w):
    viewer = Client()
    viewer.force_login(w.viewer)
    schema = viewer.get("/api/v1/schema/", {"format": "json"}).json()
    assert schema["openapi"].startswith("3.1")
    for name, declared in load_all().items():
        operation = schema["paths"][f"/api/v1/tools/{name}"]["post"]
        assert operation["requestBody"]["content"]["application/json"]["schema"] == declared.input_schema
        ok = "201" if declared.idempotent_create else "200"
        assert operation["responses"][ok]["content"]["application/json"]["schema"] == declared.output_schema
        assert {"400", "401", "403", "404", "411", "413", "429", "503"} <= set(operation["responses"])
        assert operation["responses"]["503"]["headers"]["Retry-After"]
        # An empty body is {}: the body is required exactly when {} is not valid arguments.
        assert operation["requestBody"]["required"] == (not Draft202012Validator(declared.input_schema).is_valid({}))
        if declared.category == "external_discovery":
            assert "424" in operation["responses"]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if path.startswith("/api/v1/") and method in ("get", "post"):
                assert {"401", "429", "503"} <= set(operation["responses"]), (path, method)
    # No required argument, yet {} is refused: a minimum of one property, or alternatives.
    for name in ("main_optimizer_update", "training_curve_read", "worker_add_data", "worker_submit"):
        assert schema["paths"][f"/api/v1/tools/{name}"]["post"]["requestBody"]["required"], name
    assert not schema["paths"]["/api/v1/tools/state_get_current_worker"]["post"]["requestBody"]["required"]
    after_seq = [p for p in schema["paths"]["/api/v1/events/"]["get"]["parameters"] if p["name"] == "after_seq"]
    assert after_seq[0]["schema"] == {"type": "integer", "minimum": 0, "maximum": 2**62}
    finalize = schema["paths"]["/api/v1/tools/worker_finalize"]["post"]
    assert "412" in finalize["responses"]
    assert [p["name"] for p in finalize["parameters"]] == ["If-Match"]
    spawn = schema["paths"]["/api/v1/tools/state_add_new_worker"]["post"]
    assert [p["name"] for p in spawn["parameters"]] == ["Idempotency-Key"]
    assert "/api/v1/experiments/{uuid}/lineage/" in schema["paths"]
    assert "/api/v1/tools/{name}" not in schema["paths"]
    # A file over worker_add_data's inline bound is streamed: the body is the file, the arguments the query.
    upload = schema["paths"]["/api/v1/tools/worker_add_data/upload"]["post"]
    query = {p["name"]: p["required"] for p in upload["parameters"] if p["in"] == "query"}
    assert query == {"name": False, "format": False, "teacher": False, "note": False, "sha256": True,
                     "size_bytes": True, "generator": True}  # fmt: skip
    assert "application/x-ndjson" in upload["requestBody"]["content"]
    assert {"400", "403", "411", "413"} <= set(upload["responses"])
    docs = viewer.get("/api/v1/docs/")
    assert docs.status_code == 200
    assert b"redoc" in docs.content.lower()


def test_logged_metrics_are_kept_once_never_replaced_and_read_back_in_pages(w):

    points = [{"key": "loss", "step": s, "value": 1.0 / (s + 1)} for s in range(5)]
    first = call(w, "own", "experiment_log_metrics", {"experiment": "exp_0001", "points": points})
    assert first.status_code == 200, first.json()
    assert first.json() == {"experiment": "exp_0001", "logged": 5, "unchanged": 0}
    # A retry (identical points) changes nothing; a new point in the same call is still logged.
    retry = call(
        w, "own", "experiment_log_metrics",
        {"experiment": "exp_0001", "points": [*points, {"key": "rows_kept", "step": 0, "value": 812}]},
    )  # fmt: skip
    assert retry.json() == {"experiment": "exp_0001", "logged": 1, "unchanged": 5}
    # A different value for a logged step refuses the whole call: the new point is not kept either.
    clash = [{"key": "loss", "step": 9, "value": 0.1}, {"key": "loss", "step": 2, "value": 0.9}]
    refused = call(w, "own", "experiment_log_metrics", {"experiment": "exp_0001", "points": clash})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "metric_conflict"
    assert "loss@2" in refused.json()["error"]["message"]
    assert not MetricPoint.objects.filter(key="loss", step=9).exists()
    assert MetricPoint.objects.get(key="loss", step=2).value == pytest.approx(1 / 3)
    twice = [{"key": "loss", "step": 7, "value": 0.1}, {"key": "loss", "step": 7, "value": 0.1}]
    assert (
        call(w, "own", "experiment_log_metrics", {"experiment": "exp_0001", "points": twice}).json()["error"]["code"]
        == "duplicate_point"
    )
    infinite = Client().post(
        "/api/v1/tools/experiment_log_metrics",
        data='{"experiment": "exp_0001", "points": [{"key": "loss", "step": 8, "value": 1e999}]}',
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {w.tokens['own']}",
    )
    assert infinite.status_code == 400
    assert "finite" in infinite.json()["error"]["message"]
    refusal = Event.objects.filter(run=w.run, tool="experiment_log_metrics").latest("pk")
    assert refusal.arguments["status"] == 400
    assert refusal.arguments["args"]["points"][0]["value"] == "inf"  # recorded, as far as JSON can hold it
    # The successor may read own's experiment but not write to it; another Worker cannot see it.
    not_yours = call(w, "successor", "experiment_log_metrics", {"experiment": "exp_0001", "points": points})
    assert not_yours.json()["error"]["code"] == "not_your_experiment"
    assert call(w, "other", "experiment_log_metrics", {"experiment": "exp_0001", "points": points}).status_code == 404

    page = call(w, "successor", "experiment_metrics_read", {"experiment": "exp_0001", "key": "loss", "limit": 3})
    body = page.json()
    assert body["keys"] == ["loss", "rows_kept"]
    assert [(p["step"], p["value"]) for p in body["points"]] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert body["next_after_step"] == 2
    logged = MetricPoint.objects.get(key="loss", step=0).created_at.timestamp() * 1000
    assert abs(body["points"][0]["logged_ms"] - logged) <= 1
    rest = call(w, "main", "experiment_metrics_read", {"experiment": "exp_0001", "key": "loss", "after_step": 2})
    assert [p["step"] for p in rest.json()["points"]] == [3, 4]
    assert rest.json()["next_after_step"] is None
    inspected = call(w, "rin", "reviewer_inspect_experiment", {"experiment": "exp_0001"}).json()
    assert inspected["agent_metrics"] == [
        {"key": "loss", "points": 5, "first_step": 0, "last_step": 4},
        {"key": "rows_kept", "points": 1, "first_step": 0, "last_step": 0},
    ]
    # Every call is one tool.called event naming the experiment; the rows refuse rewriting.
    logged = Event.objects.filter(run=w.run, type="tool.called", tool="experiment_log_metrics", arguments__status=200)
    assert logged.count() == 2
    assert {e.result_ref for e in logged} == {f"experiment:{w.exp['own1'].uuid}"}
    with pytest.raises(DatabaseError), transaction.atomic():
        MetricPoint.objects.filter(key="loss", step=0).update(value=0.0)


def test_alternatives_and_headers_are_refused_before_the_handler_with_the_domain_code(w):
    both = call(w, "own", "worker_add_data", {"path": "a.jsonl", "catalog": "arith-clean"})
    assert (both.status_code, both.json()["error"]["code"]) == (400, "invalid_source")
    override = call(w, "main", "main_submit_review_override", {"worker": "worker_0001", "reason": "ok"})
    assert (override.status_code, override.json()["error"]["code"]) == (400, "invalid_override")
    blank = call(w, "main", "main_submit_review_override", {"worker": "worker_0001", "reason": "  ", "spec": {}})
    assert (blank.status_code, blank.json()["error"]["code"]) == (400, "invalid_input")
    no_train = call(w, "own", "worker_submit", {"claim": "x"})
    assert (no_train.status_code, no_train.json()["error"]["code"]) == (400, "invalid_submission")
    long_tag = call(w, "rin", "reviewer_finalize", {"summary": "s"}, **{"If-Match": "0" * 201})
    assert (long_tag.status_code, long_tag.json()["error"]["code"]) == (400, "invalid_if_match")
    assert not Event.objects.filter(run=w.run, type="node.finalized").exists()


def test_read_endpoints_refuse_empty_filters_and_bad_pages_with_400(w):
    viewer = Client()
    viewer.force_login(w.viewer)
    for path, query in (
        ("/api/v1/experiments/", "run="),
        ("/api/v1/runs/", "offset=null"),
        ("/api/v1/runs/", "offset=-1"),
        ("/api/v1/runs/", "limit=0"),
        ("/api/v1/events/", "after_seq=1.5"),
        ("/api/v1/events/", f"after_seq={2**62 + 1}"),
        ("/api/v1/checkpoints/", "is_base=null"),
        ("/api/v1/checkpoints/", "is_base=yes please"),
    ):
        answer = viewer.get(f"{path}?{query}")
        assert answer.status_code == 400, (path, query, answer.content[:200])
        assert answer.json()["error"]["code"] == "invalid"
    assert viewer.get("/api/v1/runs/?limit=5000").status_code == 200  # lowered to the ceiling, as documented
    assert viewer.get(f"/api/v1/experiments/?run={w.run.uuid}").json()["count"] == 4
    bases = viewer.get("/api/v1/checkpoints/?is_base=true").json()["results"]
    assert bases
    assert all(c["is_base"] for c in bases)
    assert all(not c["is_base"] for c in viewer.get("/api/v1/checkpoints/?is_base=false").json()["results"])
    # ?format= is the datapool's filter, not a renderer choice: JSON by Accept, filtered by format.
    pool = viewer.get("/api/v1/datapool/?format=sft")
    assert pool.status_code == 200
    assert pool["Content-Type"].startswith("application/json")
    assert all(entry["format"] == "sft" for entry in pool.json()["results"])


def test_the_tools_that_act_for_a_decision_declare_what_their_refusal_sets_off():
    """The recorder calls no service: a tool whose call carries a decision id re-announces that
    decision's guidance through its own after_refusal, and no other tool has one."""
    load_all()
    acting = set()
    for name, declared in REGISTRY.items():
        decision = declared.input_schema.get("properties", {}).get("decision", {})
        if decision.get("type") == "string" and decision.get("format") == "uuid":
            acting.add(name)
            assert declared.after_refusal is decision_refused, name
        else:
            assert declared.after_refusal is None, name
    assert acting == {"state_add_new_worker", "state_add_new_reviewer"}
