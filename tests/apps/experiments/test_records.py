"""Experiments have exactly one owner; protected records cannot be deleted at the database."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction

from apps.core.errors import ApplicationError
from apps.datapool.models import DataEntry, DataReadmeEntry
from apps.experiments import services
from apps.experiments.models import Checkpoint, EventChain, Experiment, ExperimentEdge, IntegrityStatusChange
from apps.research import services as research_services
from apps.research.choices import NodeKind
from apps.research.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def worker(run):
    return research_services.node_create(run=run, kind=NodeKind.WORKER, task="w")


def new_experiment(run, owner, parents=None):
    return services.experiment_create(
        run=run,
        owner=owner,
        kind="train_eval",
        input_checkpoint=run.base_checkpoint,
        action={"recipe": "sft"},
        parents=parents,
    )


def test_experiment_handles_and_parents(run, worker):
    first = new_experiment(run, worker)
    second = new_experiment(run, worker)
    merged = new_experiment(run, worker, parents=[first, second])
    assert (first.handle, merged.handle) == ("exp_0001", "exp_0003")
    assert set(merged.parents.all()) == {first, second}


def test_second_owner_is_refused_by_database(run, worker):
    other = research_services.node_create(run=run, kind=NodeKind.WORKER, task="other")
    experiment = new_experiment(run, worker)
    with pytest.raises(DatabaseError), transaction.atomic():
        Experiment.objects.filter(pk=experiment.pk).update(owner=other)
    experiment.refresh_from_db()
    assert experiment.owner == worker


def test_reviewer_cannot_own_an_experiment(run):
    reviewer = research_services.node_create(run=run, kind=NodeKind.REVIEWER, task="r")
    with pytest.raises(ApplicationError):
        new_experiment(run, reviewer)


# Runs, experiments and event chains are also the parents of events and metric points, which carry
# no FOREIGN KEY constraint (experiments 0012): that no parent can go is what keeps them whole.
@pytest.mark.parametrize("model", [Experiment, Checkpoint, DataEntry, EventChain, Run])
def test_protected_records_cannot_be_deleted(run, worker, model):
    experiment = new_experiment(run, worker)
    DataEntry.objects.create(
        handle="data_9999",
        name="d",
        uri="file:///x",
        sha256="f" * 64,
        rows=1,
        size_bytes=1,
        format="sft",
        schema={},
        source_kind="workspace",
    )
    assert experiment.pk
    # Raw SQL, so neither the ORM's PROTECT nor any Python check is what refuses it.
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {model._meta.db_table}")
    assert model.objects.exists()


def test_histories_are_append_only(run, worker):
    experiment = new_experiment(run, worker)
    new_experiment(run, worker, parents=[experiment])
    services.experiment_set_integrity(experiment=experiment, status="accepted", actor="auto", reason="all clear")
    services.experiment_set_integrity(experiment=experiment, status="flagged", actor="reviewer_0001", reason="leak")
    history = list(
        IntegrityStatusChange.objects.filter(experiment=experiment).order_by("id").values_list("to_status", flat=True)
    )
    assert history == ["pending", "accepted", "flagged"]
    with pytest.raises(DatabaseError), transaction.atomic():
        IntegrityStatusChange.objects.filter(experiment=experiment).update(reason="rewritten")
    assert ExperimentEdge.objects.count() == 1
    with pytest.raises(DatabaseError), transaction.atomic():
        ExperimentEdge.objects.all().delete()


def test_readme_entries_are_append_only(db):
    entry = DataEntry.objects.create(
        handle="data_0001",
        name="d",
        uri="file:///x",
        sha256="e" * 64,
        rows=1,
        size_bytes=1,
        format="sft",
        schema={},
        source_kind="workspace",
    )
    note = DataReadmeEntry.objects.create(entry=entry, author="worker_0001", text="from the catalog")
    with pytest.raises(DatabaseError), transaction.atomic():
        DataReadmeEntry.objects.filter(pk=note.pk).update(text="edited")
    with pytest.raises(DatabaseError), transaction.atomic():
        DataReadmeEntry.objects.filter(pk=note.pk).delete()
    note.refresh_from_db()
    assert note.text == "from the catalog"


def test_base_checkpoint_cannot_have_a_parent(db):
    parent = Checkpoint.objects.create(handle="p", uri="u", manifest={"a": "b"}, manifest_sha256="0" * 64)
    with pytest.raises(IntegrityError), transaction.atomic():
        Checkpoint.objects.create(
            handle="b", uri="u", manifest={"a": "b"}, manifest_sha256="0" * 64, is_base=True, parent=parent
        )
