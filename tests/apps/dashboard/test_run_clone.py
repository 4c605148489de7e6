"""Re-run with changes (issue 36, item 5): "clone this run" fills the start form with every setting
of the run, the form sets every one of them, and bad input is refused with nothing created."""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse

from apps.flows.runs import run_launch
from apps.research.models import Run
from tests.factories import BenchmarkFactory, CheckpointFactory

pytestmark = pytest.mark.django_db

SETTINGS = {"wall_seconds": 1800, "accelerator_seconds": 2400, "parallel": 3, "seed": 7, "gate": True,
            "reviewer": False, "search_policy": "uct", "max_workers": 6, "screen_steps": 30, "train_steps": 120,
            "learning_rate": 5e-4, "lr_scheduler_type": "constant", "batch_size": 32}  # fmt: skip


@pytest.fixture
def original(db):
    benchmark = BenchmarkFactory(name="test/clone")
    CheckpointFactory(is_base=True, handle="test/other-theta0")
    base = CheckpointFactory(is_base=True, handle="test/theta0")
    return run_launch(benchmark=benchmark, base_checkpoint=base, name="sprint A", start=False, **SETTINGS)


def _start(client, **query):
    return client.get(reverse("dashboard:run-start"), query)


def test_clone_fills_the_form_with_every_setting_of_the_run(original, people, as_role):
    page = _start(as_role("operator"), clone=original.uuid)
    assert page.status_code == 200
    initial = page.context["form"].initial
    assert initial == {
        "name": "sprint A (re-run)", "benchmark": original.benchmark_id, "base_checkpoint": "test/theta0",
        "policy": "heuristic", "wall_seconds": 1800, "accelerator_seconds": 2400, "llm_tokens": 0, "parallel": 3,
        "no_reviewer": True, "serial_workers": False, "gate": True, "seed": 7, "search_policy": "uct",
        "max_workers": 6, "screen_steps": 30, "train_steps": 120, "learning_rate": 5e-4,
        "lr_scheduler_type": "constant", "batch_size": 32,
    }  # fmt: skip
    html = page.content.decode()
    assert 'name="train_steps" value="120"' in html
    assert 'name="max_workers" value="6"' in html
    assert '<option value="uct" selected>' in html
    assert '<option value="constant" selected>' in html
    assert '<option value="test/theta0" selected>' in html
    assert page.context["clone_notes"] == []
    assert Run.objects.count() == 1  # the form only; nothing is created until it is submitted


def test_the_form_sets_every_setting_and_a_changed_clone_differs_only_there(original, people, as_role):
    client = as_role("operator")
    form = _start(client, clone=original.uuid).context["form"]
    data = {name: value for name, value in form.initial.items() if value is not False}
    data.update(benchmark=original.benchmark_id, no_reviewer="on", gate="on", train_steps=300, name="sprint B")
    response = client.post(reverse("dashboard:run-start"), data)
    assert response.status_code == 302, response.context["form"].errors
    clone = Run.objects.exclude(pk=original.pk).get()
    assert (clone.budget_wall_seconds, clone.budget_accelerator_seconds, clone.max_parallel_workers) == (1800, 2400, 3)
    assert (clone.search_policy, clone.base_checkpoint.handle, clone.agent_mode) == ("uct", "test/theta0", "heuristic")
    assert {k: clone.policy[k] for k in ("seed", "training_gate", "reviewers", "serial_workers")} == {
        "seed": 7, "training_gate": True, "reviewers": False, "serial_workers": False}  # fmt: skip
    assert clone.policy["heuristic"] == {**original.policy["heuristic"], "train_steps": 300}


def test_a_blank_heuristic_field_keeps_the_default(original, people, as_role):
    data = {"benchmark": original.benchmark_id, "base_checkpoint": "test/theta0", "policy": "heuristic",
            "wall_seconds": 900, "accelerator_seconds": 900, "llm_tokens": 0, "parallel": 1, "seed": 0,
            "train_steps": ""}  # fmt: skip
    assert as_role("operator").post(reverse("dashboard:run-start"), data).status_code == 302
    run = Run.objects.exclude(pk=original.pk).get()
    assert run.policy["heuristic"]["train_steps"] == 200
    assert run.policy["heuristic"]["lr_scheduler_type"] == "cosine"  # blank: the training default


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("train_steps", 0, "greater than or equal to 1"),
        ("train_steps", 5001, "less than or equal to 5000"),
        ("screen_steps", "many", "Enter a whole number"),
        ("max_workers", 0, "greater than or equal to 1"),
        ("batch_size", 999, "less than or equal to 256"),
        ("learning_rate", 0, "The learning rate must be above 0"),
        ("learning_rate", 0.5, "less than or equal to 0.01"),
        ("learning_rate", "nan", "Enter a number"),
        ("lr_scheduler_type", "cosin", "Select a valid choice"),
    ],
)
def test_bad_settings_are_explained_and_nothing_is_created(original, people, as_role, field, value, message):
    client = as_role("operator")
    data = {name: v for name, v in _start(client, clone=original.uuid).context["form"].initial.items() if v}
    data[field] = value
    page = client.post(reverse("dashboard:run-start"), data)
    assert page.status_code == 200
    assert message in " ".join(page.context["form"].errors[field])
    assert f'data-field="{field}"' in page.content.decode()
    assert Run.objects.count() == 1


@pytest.mark.parametrize("clone", ["not-a-uuid", str(uuid.uuid4())])
def test_cloning_a_missing_run_says_so_and_starts_blank(original, people, as_role, clone):
    page = _start(as_role("operator"), clone=clone)
    assert page.status_code == 404
    assert "to clone: the form starts blank" in page.content.decode()
    assert page.context["form"].initial == {}
    assert Run.objects.count() == 1


def test_viewers_cannot_clone(original, people, as_role):
    assert _start(as_role("viewer"), clone=original.uuid).status_code == 403


def test_what_the_form_cannot_carry_is_named(original, people, as_role):
    Run.objects.filter(pk=original.pk).update(
        policy={**original.policy, "heuristic": {**original.policy["heuristic"], "skip_review": True}}
    )
    notes = _start(as_role("operator"), clone=original.uuid).context["clone_notes"]
    assert notes == ["Not carried over (the form has no field for it): heuristic skip_review."]
