"""A Worker never obtains sealed items, per-sample rows, references or the final split — by any tool
or resource endpoint; Reviewers see their scope's detail; the Main Agent gets redacted reports.
Every denied sealed read is recorded (an access.denied event and a test-set-access BlockedAttempt)."""

from __future__ import annotations

import json

from apps.experiments.models import Event
from apps.integrity.models import BlockedAttempt
from tests.apps.expos.conftest import FEEDBACK_IDS, FINAL_IDS, blocked_attempts
from tests.factories import CheckpointFactory

SEALED_IDS = set(FEEDBACK_IDS) | set(FINAL_IDS)


def _mentions_sealed(payload) -> list[str]:
    text = json.dumps(payload)
    return sorted(i for i in SEALED_IDS if f'"{i}"' in text or f" {i} " in text or f' {i}"' in text)


def test_worker_resource_endpoints_show_only_its_and_its_predecessors_records(api, world):
    own = {e["handle"] for e in api.get("own", "/api/v1/experiments/").json()["results"]}
    assert own == {world.exp["own1"].handle, world.exp["own2"].handle, world.exp["own_running"].handle}
    # The successor was designated to continue own: it sees own's experiments, not other's.
    successor = {e["handle"] for e in api.get("successor", "/api/v1/experiments/").json()["results"]}
    assert successor == own
    other = {e["handle"] for e in api.get("other", "/api/v1/experiments/").json()["results"]}
    assert other == {world.exp["other"].handle}
    assert api.get("other", f"/api/v1/experiments/{world.exp['own1'].uuid}/").status_code == 404
    # Nodes: a Worker sees itself and its predecessors only.
    nodes = {n["handle"] for n in api.get("successor", "/api/v1/nodes/").json()["results"]}
    assert nodes == {world.nodes["successor"].handle, world.nodes["own"].handle}


def test_worker_gets_rounded_aggregate_feedback_scores_only(api, world):
    evaluations = api.get("own", "/api/v1/evaluations/").json()["results"]
    assert {e["uuid"] for e in evaluations} == {str(world.evals["own1"].uuid), str(world.evals["own2"].uuid)}
    assert all(e["split"] == "feedback" for e in evaluations)
    first = next(e for e in evaluations if e["uuid"] == str(world.evals["own1"].uuid))
    assert first["score"] == 0.37  # 11/30 rounded to the policy's 2 decimals
    assert first["correct"] is None  # the exact count would undo the rounding
    experiment = api.get("own", f"/api/v1/experiments/{world.exp['own1'].uuid}/").json()
    assert experiment["feedback_score"] == 0.37
    # People see exact values.
    person = api.get("viewer", f"/api/v1/evaluations/{world.evals['own1'].uuid}/").json()
    assert person["score"] == 11 / 30
    assert person["correct"] == 11


def test_worker_sealed_reads_are_refused_and_recorded(api, world):
    before = blocked_attempts(world)
    final = api.get("own", f"/api/v1/evaluations/{world.evals['own_final'].uuid}/")
    assert final.status_code == 403
    assert final.json()["error"]["code"] == "sealed"
    samples = api.get("own", f"/api/v1/evaluations/{world.evals['own1'].uuid}/samples/")
    assert samples.status_code == 403
    assert samples.json()["error"]["code"] == "sealed"
    final_samples = api.get("own", f"/api/v1/evaluations/{world.evals['own_final'].uuid}/samples/")
    assert final_samples.status_code == 403
    logs = api.call("own", "job_logs", {"job": str(world.jobs["own_eval"].uuid)})
    assert logs.status_code == 403
    assert logs.json()["error"]["code"] == "sealed"
    assert "s0001" not in logs.text
    # Four refusals, four pieces of evidence — the tool's survived its rolled-back transaction.
    assert blocked_attempts(world) == before + 4
    attempts = BlockedAttempt.objects.filter(run=world.run, node=world.nodes["own"])
    assert set(attempts.values_list("subcategory", flat=True)) == {"test_set_access"}
    assert Event.objects.filter(run=world.run, type="access.denied", actor="worker_0001").count() == 4
    # The Main Agent is refused per-sample rows too.
    main = api.get("main", f"/api/v1/evaluations/{world.evals['own1'].uuid}/samples/")
    assert main.status_code == 403


def test_worker_lists_never_include_the_final_split_or_samples(api, world):
    for who in ("own", "other", "successor", "main"):
        listed = api.get(who, "/api/v1/evaluations/", split="final").json()["results"]
        assert listed == [], who
    for who in ("own", "other", "successor"):
        for path in (
            "/api/v1/experiments/",
            "/api/v1/evaluations/",
            "/api/v1/events/",
            "/api/v1/reports/",
            "/api/v1/checkpoints/",
            "/api/v1/nodes/",
            "/api/v1/runs/",
        ):
            response = api.get(who, path, limit=500)
            assert response.status_code == 200, (who, path)
            assert "model output" not in response.text, (who, path)
        for tool, body in [
            ("events_tail", {"limit": 200}),
            ("state_get_current_worker", {}),
            ("compare_experiments", {"a": world.exp["own1"].handle, "b": world.exp["own2"].handle}),
            ("get_lineage", {"experiment": world.exp["own1"].handle}),
        ]:
            response = api.call(who, tool, body)
            assert "model output" not in response.text, (who, tool)
            assert not _mentions_sealed(response.json()), (who, tool)


def test_worker_compare_experiments_gets_aggregate_ci_only(api, world):
    body = {"a": world.exp["own1"].handle, "b": world.exp["own2"].handle, "n_boot": 500, "seed": 3}
    worker = api.call("own", "compare_experiments", body).json()
    assert worker["rounded"] is True
    assert worker["difference"] == 0.2  # (17 - 11) / 30 on the common samples, rounded
    assert worker["ci_low"] <= worker["difference"] <= worker["ci_high"]
    assert set(worker) == {
        "a",
        "b",
        "n_common",
        "difference",
        "ci_low",
        "ci_high",
        "confidence",
        "n_boot",
        "p_value",
        "rounded",
    }
    main = api.call("main", "compare_experiments", body).json()
    assert main["rounded"] is False
    assert abs(main["difference"] - 0.2) < 1e-9
    assert main["ci_low"] > 0  # six more right, none fewer: the whole interval is above zero


def test_reviewer_in_scope_sees_per_sample_outputs_but_no_references(api, world):
    rows = api.get("rin", f"/api/v1/evaluations/{world.evals['own1'].uuid}/samples/").json()["results"]
    assert len(rows) == 30
    assert set(rows[0]) == {"sample_id", "output", "correct"}
    compared = api.call(
        "rin", "compare_eval_samples", {"a": str(world.evals["own1"].uuid), "b": str(world.evals["own2"].uuid)}
    ).json()
    assert compared["n_common"] == 30
    assert compared["b_only_correct"] == 6
    assert compared["a_only_correct"] == 0
    assert {s["sample_id"] for s in compared["samples"]} == set(FEEDBACK_IDS[11:17])
    assert all("reference" not in key for s in compared["samples"] for key in s)
    inspected = api.call("rin", "reviewer_inspect_experiment", {"experiment": world.exp["own1"].handle}).json()
    assert inspected["result"]["feedback_score"] == 11 / 30  # exact for the Reviewer
    assert inspected["artifacts"]["output_checkpoint"]["manifest"]
    # Out of scope: refused, and the per-sample attempt recorded.
    before = blocked_attempts(world)
    out = api.get("rout", f"/api/v1/evaluations/{world.evals['own1'].uuid}/samples/")
    assert out.status_code == 403
    assert blocked_attempts(world) == before + 1


def test_main_gets_reports_redacted(api, world):
    full = api.call("rin", "inspect_reviewer_report", {"reviewer": world.nodes["rin"].handle}).json()["reports"][0]
    assert full["observations"][0]["evidence"]["sample_ids"] == ["s0003"]
    assert "s0003" in full["summary"]
    for redacted in (
        api.call("main", "inspect_reviewer_report", {"reviewer": world.nodes["rin"].handle}).json()["reports"][0],
        api.get("main", "/api/v1/reports/").json()["results"][0],
    ):
        assert redacted["redacted"] is True
        assert "evidence" not in redacted["observations"][0]
        assert redacted["observations"][0]["evidence_redacted"] is True
        assert "s0003" not in json.dumps(redacted)
        assert "s0007" not in json.dumps(redacted)
        assert "[sealed]" in redacted["summary"]
    # Workers get no reports at all.
    assert api.get("own", "/api/v1/reports/").json()["results"] == []


def test_events_tail_is_filtered_by_visibility(api, world):
    api.call("other", "public_check_quota")
    api.call("own", "public_check_quota")
    seen = api.call("own", "events_tail", {"limit": 200}).json()["events"]
    actors = {e["actor"] for e in seen}
    assert "worker_0001" in actors
    assert "worker_0002" not in actors
    assert "main" not in actors
    # The Main sees everyone's events, but reviewer arguments only as redacted.
    api.call("rin", "compare_eval_samples", {"a": str(world.evals["own1"].uuid), "b": str(world.evals["own2"].uuid)})
    main = api.call("main", "events_tail", {"limit": 200, "types": ["tool.called"]}).json()["events"]
    assert {"worker_0001", "worker_0002", world.nodes["rin"].handle} <= {e["actor"] for e in main}
    assert all(e["arguments"] == {"redacted": True} for e in main if e["role"] == "reviewer")


def test_reference_checkpoint_is_hidden_from_agents(api, world):
    reference = CheckpointFactory(is_reference=True)
    world.run.benchmark.reference_checkpoint = reference
    world.run.benchmark.save(update_fields=["reference_checkpoint"])
    for who in ("main", "own", "rin"):
        handles = {c["handle"] for c in api.get(who, "/api/v1/checkpoints/", limit=500).json()["results"]}
        assert reference.handle not in handles
        assert world.run.base_checkpoint.handle in handles
    assert api.get("own", f"/api/v1/checkpoints/{reference.uuid}/").status_code == 404
