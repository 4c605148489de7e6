"""Starting a run from the browser: operators only, validation messages, the service start_run uses."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.research.choices import RunStatus
from apps.research.models import Run
from tests.apps.research.test_run_launch import FAST
from tests.factories import BenchmarkFactory, CheckpointFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def registered(db):
    return BenchmarkFactory(name="test/form"), CheckpointFactory(is_base=True, handle="test/theta0")


@pytest.fixture
def profiles(monkeypatch):
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)


def _post(benchmark, **changes):
    data = {"name": "", "benchmark": benchmark.pk, "base_checkpoint": "test/theta0", "policy": "heuristic",
            "wall_seconds": 900, "accelerator_seconds": 1200, "llm_tokens": 0, "parallel": 2, "seed": 3}  # fmt: skip
    data.update(changes)
    return data


def test_only_operators_get_the_form(registered, people, as_role):
    url = reverse("dashboard:run-start")
    assert as_role("viewer").get(url).status_code == 403
    assert as_role("viewer").post(url, _post(registered[0])).status_code == 403
    assert as_role("operator").get(url).status_code == 200
    assert Run.objects.count() == 0


def test_an_operator_starts_a_run(registered, people, as_role):
    benchmark, base = registered
    response = as_role("operator").post(reverse("dashboard:run-start"), _post(benchmark, no_reviewer="on"))
    run = Run.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("dashboard:run-detail", args=[run.uuid])
    assert (run.status, run.base_checkpoint, run.created_by) == (RunStatus.RUNNING, base, people["operator"])
    assert (run.budget_wall_seconds, run.budget_accelerator_seconds, run.max_parallel_workers) == (900, 1200, 2)
    assert (run.policy["reviewers"], run.policy["seed"], run.name) == (False, 3, "test/form heuristic")
    assert run.status_changes.filter(to_status=RunStatus.RUNNING, actor="user:operator-person").exists()


def test_mistakes_are_explained_next_to_their_field(registered, people, as_role, profiles):
    benchmark, _ = registered
    client = as_role("operator")
    page = client.post(
        reverse("dashboard:run-start"),
        _post(benchmark, serial_workers="on", policy="llm:fast", wall_seconds=5, seed=-1),
    )
    assert page.status_code == 200  # the form again, with its messages
    errors = page.context["form"].errors
    assert errors["parallel"] == ["--serial-workers runs one Worker at a time: set max parallel Workers to 1."]
    assert errors["llm_tokens"] == ["An LLM run needs a token budget above 0 (e.g. 2000000)."]
    assert "greater than or equal to 60" in errors["wall_seconds"][0]
    assert "greater than or equal to 0" in errors["seed"][0]
    unknown = client.post(reverse("dashboard:run-start"), _post(benchmark, policy="llm:nope"))
    assert "Select a valid choice" in unknown.context["form"].errors["policy"][0]
    assert Run.objects.count() == 0


def test_llm_profiles_are_offered_by_name_and_never_show_a_key(registered, people, as_role, profiles):
    benchmark, _ = registered
    client = as_role("operator")
    html = client.get(reverse("dashboard:run-start")).content.decode()
    assert 'value="llm:fast"' in html
    assert "sk-fast-secret" not in html
    assert "127.0.0.1:9" not in html
    client.post(reverse("dashboard:run-start"), _post(benchmark, policy="llm:fast", llm_tokens=10_000))
    run = Run.objects.get()
    assert (run.agent_mode, run.policy["llm_profile"], run.budget_llm_tokens) == ("llm", "fast", 10_000)


def test_the_search_policy_chosen_in_the_form_is_recorded_on_the_run(registered, people, as_role):
    benchmark, _ = registered
    client = as_role("operator")
    client.post(reverse("dashboard:run-start"), _post(benchmark, search_policy="uct", name="uct from the form"))
    run = Run.objects.get(name="uct from the form")
    assert run.search_policy == "uct"
    # The run page's decision panel says which policy chose the nodes.
    page = client.get(reverse("dashboard:run-detail", args=[run.uuid]))
    assert 'id="search-policy"' in page.content.decode()
    assert "<strong>uct</strong>" in page.content.decode()
    # ... and the API's run record carries it.
    assert client.get(f"/api/v1/runs/{run.uuid}/").json()["search_policy"] == "uct"
    refused = client.post(reverse("dashboard:run-start"), _post(benchmark, search_policy="random", name="no"))
    assert "Select a valid choice" in refused.context["form"].errors["search_policy"][0]
    assert not Run.objects.filter(name="no").exists()
    # Left out, the form keeps the original behaviour.
    client.post(reverse("dashboard:run-start"), _post(benchmark, name="default policy"))
    assert Run.objects.get(name="default policy").search_policy == "greedy"
