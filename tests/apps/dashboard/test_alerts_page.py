"""The alerts page: a person saves and removes their own alerts; every bad input answers 400 with its
message next to the field and stores nothing."""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse

from apps.alerts.models import AlertRule
from tests.factories import make_run

pytestmark = pytest.mark.django_db

GOOD = {"channel": "slack", "target": "https://hooks.example.org/services/T0/B0/secret", "triggers": ["run_finished"]}


def test_a_person_saves_an_alert_for_a_run_and_sees_it_without_its_secret(people, as_role):
    run = make_run(name="watched")
    client = as_role("viewer")
    form = client.get(reverse("dashboard:alerts"), {"run": run.uuid})
    assert f'value="{run.uuid}"' in form.content.decode()
    saved = client.post(
        reverse("dashboard:alerts"), {**GOOD, "run": run.uuid, "triggers": ["run_finished", "job_failed"]}
    )
    assert saved.status_code == 302
    rule = AlertRule.objects.get()
    assert (rule.owner, rule.run, rule.triggers) == (people["viewer"], run, ["run_finished", "job_failed"])
    page = client.get(reverse("dashboard:alerts")).content.decode()
    assert "https://hooks.example.org/…" in page
    assert "secret" not in page.split('id="alert-rules"')[1]


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"channel": "pager"}, "channel", "Select a valid choice"),
        ({"target": "javascript:alert(1)"}, "target", "Enter the webhook's http(s) URL."),
        ({"channel": "email", "target": "nobody"}, "target", "Enter an e-mail address."),
        ({"triggers": []}, "triggers", "This field is required."),
        ({"triggers": ["coffee_ready"]}, "triggers", "Select a valid choice"),
        ({"run": "not-a-uuid"}, "run", "Enter a valid UUID."),
        ({"run": str(uuid.uuid4())}, "run", "No such run that you may watch."),
    ],
)
def test_bad_alerts_are_explained_and_nothing_is_stored(people, as_role, changes, field, message):
    page = as_role("viewer").post(reverse("dashboard:alerts"), {**GOOD, **changes})
    assert page.status_code == 400
    assert message in " ".join(page.context["form"].errors[field])
    assert AlertRule.objects.count() == 0


def test_only_the_owner_removes_an_alert(people, as_role):
    as_role("viewer").post(reverse("dashboard:alerts"), GOOD)
    rule = AlertRule.objects.get()
    url = reverse("dashboard:alert-delete", args=[rule.uuid])
    refused = as_role("operator").post(url, HTTP_ACCEPT="application/json")
    assert (refused.status_code, refused.json()["code"]) == (400, "not_yours")
    assert AlertRule.objects.count() == 1
    assert as_role(None).post(url).status_code in (302, 403)
    assert as_role("viewer").post(url).status_code == 302
    assert AlertRule.objects.count() == 0
