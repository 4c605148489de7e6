"""The dashboard's pages per role: who gets in, and that each page shows what it is for."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from apps.dashboard.selectors import run_snapshot
from apps.expos.auth import agent_token_issue
from tests.apps.dashboard.live_helpers import as_json

pytestmark = pytest.mark.django_db


def _pages(world) -> dict[str, str]:
    run = world.run.uuid
    return {
        "runs": reverse("dashboard:run-list"),
        "run": reverse("dashboard:run-detail", args=[run]),
        "snapshot": reverse("dashboard:run-snapshot", args=[run]),
        "charts": reverse("dashboard:run-charts", args=[run]),
        "node": reverse("dashboard:node-detail", args=[run, world.nodes["w1"].uuid]),
        "experiment": reverse("dashboard:experiment", args=[run, "exp_0002"]),
        "report": reverse("dashboard:report", args=[run, world.report.uuid]),
        "integrity": reverse("dashboard:integrity", args=[run]),
        "job": reverse("dashboard:job", args=[world.jobs["running"].uuid]),
        "datapool": reverse("dashboard:datapool"),
        "data": reverse("dashboard:data-entry", args=["data_0001"]),
    }


def test_anonymous_visitors_are_sent_to_the_login_page(world, as_role):
    client = as_role(None)
    for name, url in _pages(world).items():
        response = client.get(url)
        assert response.status_code == 302, name
        assert response["Location"].startswith(f"{reverse('login')}?next="), name


def test_agent_token_does_not_open_the_pages(world, as_role):
    token, _ = agent_token_issue(run=world.run, node=world.nodes["w3"], role="worker")
    client = as_role(None)
    for name, url in _pages(world).items():
        response = client.get(url, HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 302, name
        assert response["Location"].startswith(reverse("login")), name


def test_agent_token_is_not_a_password(world, as_role):
    token, _ = agent_token_issue(run=world.run, node=world.nodes["w3"], role="worker")
    client = as_role(None)
    response = client.post(reverse("login"), {"username": "worker_0003", "password": token})
    assert response.status_code == 200  # the form again, with its error
    assert "_auth_user_id" not in client.session


def test_signed_in_person_without_a_role_is_forbidden(world, as_role):
    client = as_role("nobody")
    for name, url in _pages(world).items():
        assert client.get(url).status_code == 403, name


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
def test_every_role_sees_every_page(world, as_role, role):
    client = as_role(role)
    for name, url in _pages(world).items():
        assert client.get(url).status_code == 200, name


def test_runs_list_shows_status_best_accepted_score_and_budget_bars(world, as_role, django_assert_max_num_queries):
    client = as_role("viewer")
    # The outcome columns (final score, gain, hacking, the returned recipe) are read in a fixed
    # number of grouped queries whatever the number of runs (apps.dashboard.workbench.run_rows), and
    # so are the jobs training now (the live bars) and the flags: one query each for every row.
    with django_assert_max_num_queries(16):
        response = client.get(reverse("dashboard:run-list"))
    html = response.content.decode()
    assert "arithmetic sprint" in html
    assert "status-running" in html
    # exp_0002 scored 0.61 but is flagged; the best *accepted* is exp_0001's 0.42.
    assert "0.420" in html
    assert "0.610" not in html
    assert 'data-budget="accelerator"' in html
    # 900 s charged and the training running for 3 minutes: (900 + 180) / 3600, live (issue 36).
    assert re.search(r'data-budget="accelerator".*?width: 30\.\d%', html, re.S)
    assert 'data-budget="LLM tokens"' in html


def test_run_page_for_a_viewer_has_no_steering(world, as_role):
    html = as_role("viewer").get(reverse("dashboard:run-detail", args=[world.run.uuid])).content.decode()
    assert 'id="dag"' in html
    assert 'id="expgraph"' in html
    assert 'id="guidance-form"' not in html
    assert 'id="run-control"' not in html
    assert f'"ws": "/ws/runs/{world.run.uuid}/"' in html


def test_run_page_for_an_operator_has_guidance_and_controls(world, as_role):
    html = as_role("operator").get(reverse("dashboard:run-detail", args=[world.run.uuid])).content.decode()
    assert 'id="guidance-form"' in html
    assert 'name="csrfmiddlewaretoken"' in html
    for action in ("pause", "resume", "stop"):
        assert f'value="{action}"' in html


def test_snapshot_endpoint_is_the_websocket_snapshot(world, as_role, django_assert_max_num_queries):
    client = as_role("viewer")
    with django_assert_max_num_queries(14):
        response = client.get(reverse("dashboard:run-snapshot", args=[world.run.uuid]))
    assert response.json() == as_json(run_snapshot(run=world.run))


def test_node_panel_has_task_summary_experiments_and_reports(world, as_role):
    client = as_role("viewer")
    worker = client.get(reverse("dashboard:node-detail", args=[world.run.uuid, world.nodes["w1"].uuid])).json()
    assert worker["task"] == "SFT on clean arithmetic"
    assert worker["summary"].startswith("SFT on clean data reached 0.42")
    assert [x["handle"] for x in worker["experiments"]] == ["exp_0001", "exp_0002"]
    assert [r["uuid"] for r in worker["reports"]] == [str(world.report.uuid)]
    assert worker["decision"]["kind"] == "branch"
    assert {d["handle"] for d in worker["downstream"]} == {"reviewer_0001", "worker_0003"}

    reviewer = client.get(reverse("dashboard:node-detail", args=[world.run.uuid, world.nodes["r1"].uuid])).json()
    assert reviewer["upstream"] == [
        {"uuid": str(world.nodes["w1"].uuid), "handle": "worker_0001", "kind": "review_scope"}
    ]
    assert [x["handle"] for x in reviewer["experiments"]] == ["exp_0001", "exp_0002"]  # its scope
    assert reviewer["decision"]["kind"] == "verify"


def test_experiment_page_shows_action_data_manifest_evaluations_integrity_reviews_lineage(world, as_role):
    html = as_role("viewer").get(reverse("dashboard:experiment", args=[world.run.uuid, "exp_0001"])).content.decode()
    assert "&quot;learning_rate&quot;: 0.0001" in html  # the action, as JSON
    assert world.data.sha256 in html  # data with its hash
    assert "config.json" in html
    assert "b" * 64 in html
    assert "reaches θ0" in html
    # 42/100 on feedback: Wilson 95% interval 0.328 – 0.518.
    assert "0.420" in html
    assert "0.328 – 0.518" in html
    assert "42/100" in html
    assert "NOT_FOUND_FULL" in html
    assert str(world.report.uuid) in html
    assert "exp_0002" in html
    assert "exp_0004" in html


def test_flagged_experiment_page_shows_the_violation_and_its_adjudication(world, as_role):
    html = as_role("viewer").get(reverse("dashboard:experiment", args=[world.run.uuid, "exp_0002"])).content.decode()
    assert "EXECUTED" in html
    assert "EXPLICIT_VIOLATION" in html
    assert "training data contains sealed feedback items" in html
    assert "integrity-flagged" in html
    assert "Starts from θ0" not in html  # it continues exp_0001
    assert 'class="adjudicate"' not in html  # viewers do not adjudicate


def test_admin_gets_adjudication_forms_with_a_required_reason(world, as_role):
    html = as_role("admin").get(reverse("dashboard:integrity", args=[world.run.uuid])).content.decode()
    assert 'class="adjudicate"' in html
    assert 'name="rationale" required' in html
    operator_html = as_role("operator").get(reverse("dashboard:integrity", args=[world.run.uuid])).content.decode()
    assert 'class="adjudicate"' not in operator_html


def test_integrity_page_matrix_hacking_rate_and_blocked_attempts(world, as_role):
    response = as_role("viewer").get(reverse("dashboard:integrity", args=[world.run.uuid]))
    html = response.content.decode()
    context = response.context
    # exp_0001..3 ran (succeeded); exp_0004 runs: 4 ran, one (exp_0002) with an executed violation.
    assert context["ran"] == 4
    assert context["hacked"] == 1
    assert 'id="hacking-rate">25.0%' in html
    rows = {row["experiment"].handle: [c["state"] for c in row["cells"]] for row in context["rows"]}
    assert len(rows["exp_0001"]) == 12
    assert set(rows["exp_0001"]) == {"clean"}
    assert rows["exp_0002"].count("violation") == 1
    assert rows["exp_0003"].count("pending") == 1
    assert set(rows["exp_0004"]) == {"unknown"}  # no check ran: fails closed
    assert [f.subcategory for f in context["needs_adjudication"]] == ["metric_attribution"]
    assert 'id="blocked-count">1<' in html
    assert "the data overlaps 12 sealed feedback items" in html


def test_report_page_shows_findings_and_evidence(world, as_role):
    html = as_role("viewer").get(reverse("dashboard:report", args=[world.run.uuid, world.report.uuid])).content.decode()
    assert "exp_0002 trained on sealed feedback items" in html
    assert "drop exp_0002&#x27;s data" in html
    assert "12 items overlap" in html
    assert "&quot;f1&quot;" in html


def test_job_page_shows_progress_metrics_and_log_tail(world, as_role):
    response = as_role("viewer").get(reverse("dashboard:job", args=[world.jobs["running"].uuid]))
    html = response.content.decode()
    assert 'style="width: 40%"' in html
    assert response.context["snapshot"]["log"][-1] == "step 20: loss=1.5"
    assert f'"ws": "/ws/jobs/{world.jobs["running"].uuid}/"' in html


def test_datapool_pages_show_hashes_usage_and_readme(world, as_role):
    client = as_role("viewer")
    listing = client.get(reverse("dashboard:datapool")).content.decode()
    assert "data_0001" in listing
    assert "clean arithmetic" in listing
    assert client.get(reverse("dashboard:datapool"), {"q": "nothing-like-it"}).context["entries"].count() == 0
    detail = client.get(reverse("dashboard:data-entry", args=["data_0001"])).content.decode()
    assert world.data.sha256 in detail
    assert "Filtered the catalog copy for format." in detail
    assert "exp_0001" in detail
    assert "Could not read the artifact" in detail  # its file is not in this test's store


def test_charts_document_has_the_five_figures(world, as_role):
    charts = as_role("viewer").get(reverse("dashboard:run-charts", args=[world.run.uuid])).json()
    assert set(charts) == {"best_so_far", "experiment_scores", "tool_use", "accelerator", "budget"}
    best = charts["best_so_far"]
    assert best["data"][0]["y"][:1] == [0.42]  # only accepted experiments count
    shapes = {round(s["y0"], 3) for s in best["layout"]["shapes"]}
    assert {0.3, 0.25, 0.75, 0.7} <= shapes  # θ0 and reference, feedback and final
    assert [t["name"] for t in charts["experiment_scores"]["data"]] == ["worker_0001", "worker_0002"]


def test_unknown_records_are_404(world, as_role):
    client = as_role("viewer")
    run = world.run.uuid
    assert client.get(reverse("dashboard:experiment", args=[run, "exp_9999"])).status_code == 404
    assert client.get(reverse("dashboard:data-entry", args=["data_9999"])).status_code == 404
    assert client.get(reverse("dashboard:node-detail", args=[run, world.report.uuid])).status_code == 404
