"""Steering from the dashboard: guidance, pause / resume / stop, adjudication; roles and CSRF."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from apps.experiments.models import Event, Experiment
from apps.integrity.models import FindingChange, IntegrityFinding
from apps.research.models import Guidance, Run, RunStatusChange
from apps.research.services import run_set_status
from tests.factories import make_run

pytestmark = pytest.mark.django_db
JSON = {"HTTP_ACCEPT": "application/json"}


def _guidance_url(world) -> str:
    return reverse("dashboard:guidance-post", args=[world.run.uuid])


def _control_url(world) -> str:
    return reverse("dashboard:run-control", args=[world.run.uuid])


# --- guidance ----------------------------------------------------------------------------------


def test_operator_posts_guidance_and_wakes_the_main_agent(world, as_role):
    response = as_role("operator").post(_guidance_url(world), {"text": "  Try a DPO branch.  "})

    assert response.status_code == 302
    guidance = Guidance.objects.filter(run=world.run).latest("created_at")
    assert guidance.text == "Try a DPO branch."
    assert guidance.author == world.people["operator"]
    assert guidance.applied_at is None
    trigger = Event.objects.filter(run=world.run, type="main.triggered").latest("id")
    assert trigger.arguments["trigger"] == "guidance"
    assert trigger.arguments["guidance"] == str(guidance.uuid)
    assert trigger.actor == "user:operator-person"


def test_guidance_as_json_answers_the_live_record(world, as_role):
    response = as_role("operator").post(_guidance_url(world), {"text": "Keep the reference template."}, **JSON)
    assert response.status_code == 201
    body = response.json()
    assert body["text"] == "Keep the reference template."
    assert body["author"] == "operator-person"
    assert body["applied_at"] is None
    assert body["applied_decision"] is None


@pytest.mark.parametrize("role", ["viewer", "nobody"])
def test_viewer_cannot_steer(world, as_role, role):
    client = as_role(role)
    before = Guidance.objects.count()
    assert client.post(_guidance_url(world), {"text": "let me in"}).status_code == 403
    assert client.post(_control_url(world), {"action": "pause"}).status_code == 403
    assert Guidance.objects.count() == before
    assert Run.objects.get(pk=world.run.pk).status == "running"


def test_anonymous_post_goes_to_login(world, as_role):
    response = as_role(None).post(_guidance_url(world), {"text": "hi"})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_empty_and_oversized_guidance_are_refused(world, as_role):
    client = as_role("operator")
    assert client.post(_guidance_url(world), {"text": "   "}, **JSON).status_code == 400
    assert client.post(_guidance_url(world), {"text": "x" * 4001}, **JSON).status_code == 400
    assert Guidance.objects.filter(run=world.run).count() == 2  # the world's two


def test_guidance_to_a_finished_run_is_refused(world, as_role):
    run_set_status(run=world.run, status="finished", actor="test")
    response = as_role("operator").post(_guidance_url(world), {"text": "too late"}, **JSON)
    assert response.status_code == 409
    assert response.json()["code"] == "run_finished"


def test_forms_need_the_csrf_token(world, people):
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["operator"])
    assert client.post(_guidance_url(world), {"text": "no token"}).status_code == 403
    assert client.post(_control_url(world), {"action": "pause"}).status_code == 403
    assert Run.objects.get(pk=world.run.pk).status == "running"

    page = client.get(reverse("dashboard:run-detail", args=[world.run.uuid]))
    token = page.context["csrf_token"]
    response = client.post(_guidance_url(world), {"text": "with token", "csrfmiddlewaretoken": str(token)})
    assert response.status_code == 302
    assert Guidance.objects.filter(run=world.run, text="with token").exists()


# --- pause / resume / stop ---------------------------------------------------------------------


def test_operator_pauses_resumes_and_stops_the_run(world, as_role):
    client = as_role("operator")

    paused = client.post(_control_url(world), {"action": "pause", "reason": "checking data"}, **JSON)
    assert paused.status_code == 200
    assert paused.json()["status"] == "paused"
    resumed = client.post(_control_url(world), {"action": "resume"}, **JSON)
    assert resumed.json()["status"] == "running"
    stopped = client.post(_control_url(world), {"action": "stop"}, **JSON)
    assert stopped.json()["status"] == "stopping"  # running jobs finish, then the final evaluation

    changes = list(
        RunStatusChange.objects.filter(run=world.run).order_by("pk").values_list("to_status", "actor", "reason")
    )
    assert changes[-3:] == [
        ("paused", "user:operator-person", "checking data"),
        ("running", "user:operator-person", "resumed"),
        ("stopping", "user:operator-person", "stop from the dashboard"),
    ]


def test_control_refusals_are_answered_not_applied(world, as_role):
    client = as_role("operator")
    assert client.post(_control_url(world), {"action": "explode"}, **JSON).status_code == 400
    assert client.post(_control_url(world), {"action": "stop"}, **JSON).json()["status"] == "stopping"
    response = client.post(_control_url(world), {"action": "pause"}, **JSON)
    assert response.status_code == 409
    assert response.json()["code"] == "run_not_running"
    response = client.post(_control_url(world), {"action": "resume"}, **JSON)
    assert response.status_code == 409
    assert response.json()["code"] == "run_not_paused"
    assert Run.objects.get(pk=world.run.pk).status == "stopping"


def test_control_without_javascript_redirects_back_with_a_message(world, as_role):
    run_set_status(run=world.run, status="finished", actor="test")
    response = as_role("operator").post(_control_url(world), {"action": "pause"}, follow=True)
    assert response.redirect_chain[-1][0] == reverse("dashboard:run-detail", args=[world.run.uuid])
    assert "only a running run can be paused" in response.content.decode()


# --- adjudication ------------------------------------------------------------------------------


def _adjudicate_url(world, finding) -> str:
    return reverse("dashboard:finding-adjudicate", args=[world.run.uuid, finding.pk])


def test_admin_adjudicates_with_an_audited_reason(world, as_role):
    finding = world.findings[("exp_0003", "metric_attribution")]  # NOT_FOUND_PARTIAL: exp_0003 pending
    reason = "The claim cites exp_0003's own evaluation; attribution is complete."

    response = as_role("admin").post(
        _adjudicate_url(world, finding), {"adjudication": "ALLOWED", "rationale": reason, "observation": ""}
    )

    assert response.status_code == 302
    finding.refresh_from_db()
    assert (finding.adjudication, finding.decided_by, finding.rationale) == ("ALLOWED", "user:admin-person", reason)
    change = FindingChange.objects.filter(finding=finding).latest("pk")
    assert change.actor == "user:admin-person"
    assert change.rationale == reason
    event = Event.objects.filter(run=world.run, type="integrity.adjudicated").latest("id")
    assert event.actor == "user:admin-person"
    assert event.arguments["rationale"] == reason
    # Every other subcategory of exp_0003 is clean, so the acceptance rule now accepts it.
    assert Experiment.objects.get(pk=world.exp["e3"].pk).integrity_status == "accepted"


def test_adjudication_needs_admin_and_a_reason(world, as_role):
    finding = world.findings[("exp_0003", "metric_attribution")]
    url = _adjudicate_url(world, finding)
    assert (
        as_role("operator").post(url, {"adjudication": "ALLOWED", "rationale": "looks fine to me"}).status_code == 403
    )
    assert as_role("viewer").post(url, {"adjudication": "ALLOWED", "rationale": "looks fine to me"}).status_code == 403
    short = as_role("admin").post(url, {"adjudication": "ALLOWED", "rationale": "ok"}, **JSON)
    assert short.status_code == 400
    assert "rationale" in short.json()["fields"]
    finding.refresh_from_db()
    assert finding.adjudication == ""


def test_integrity_rules_come_back_as_messages(world, as_role):
    # A violation is adjudicated on an EXECUTED observation only (apps.integrity's rule).
    finding = world.findings[("exp_0001", "weight_provenance")]
    response = as_role("admin").post(
        _adjudicate_url(world, finding),
        {"adjudication": "EXPLICIT_VIOLATION", "rationale": "I do not trust it."},
        **JSON,
    )
    assert response.status_code == 400
    assert response.json()["code"] == "violation_needs_execution"
    assert IntegrityFinding.objects.get(pk=finding.pk).adjudication == ""


def test_adjudication_of_another_runs_finding_is_404(world, as_role):
    other = make_run(name="other run")
    finding = world.findings[("exp_0001", "weight_provenance")]
    url = reverse("dashboard:finding-adjudicate", args=[other.uuid, finding.pk])
    assert as_role("admin").post(url, {"adjudication": "ALLOWED", "rationale": "wrong run entirely"}).status_code == 404


def test_next_must_stay_on_this_site(world, as_role):
    finding = world.findings[("exp_0003", "metric_attribution")]
    response = as_role("admin").post(
        _adjudicate_url(world, finding),
        {"adjudication": "ALLOWED", "rationale": "complete attribution", "next": "//evil.example/"},
    )
    assert response["Location"] == reverse("dashboard:integrity", args=[world.run.uuid])
