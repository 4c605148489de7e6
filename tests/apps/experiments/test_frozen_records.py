"""Values written once stay as written, and the integrity status changes only with its audit row.

Every write here goes around the services (ORM ``.update()``, raw SQL), the way an admin, a
script or a bug would, and the database refuses it; the services' own paths still work.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from django.db import DatabaseError, connection, transaction

from apps.experiments import services
from apps.experiments.choices import IntegrityStatus
from apps.experiments.models import Checkpoint, Evaluation, Experiment, IntegrityStatusChange
from apps.research import services as research_services
from apps.research.choices import NodeKind
from tests.factories import CheckpointFactory
from tests.support.procs import run_python, sqlite_env

pytestmark = pytest.mark.django_db


@pytest.fixture
def experiment(run):
    worker = research_services.node_create(run=run, kind=NodeKind.WORKER, task="w")
    return services.experiment_create(
        run=run, owner=worker, kind="train_eval", input_checkpoint=run.base_checkpoint, action={"recipe": "sft"}
    )


@pytest.fixture
def evaluation(run, experiment):
    return Evaluation.objects.create(
        run=run,
        experiment=experiment,
        checkpoint=run.base_checkpoint,
        benchmark=run.benchmark,
        split="final",
        score=0.0,
        correct=0,
        sample_count=2,
    )


GUARD = r"append-only|cannot change once set|changes only with"  # the triggers' messages (apps.core.db)


def refused(sql: str, params: list[object]) -> None:
    """Raw SQL, so neither the ORM nor any Python check is what refuses it: the trigger is."""
    with pytest.raises(DatabaseError, match=GUARD), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


@pytest.mark.parametrize(
    ("column", "value"),
    [("score", 0.99), ("split", "feedback"), ("correct", 2), ("status", "refused"), ("data_sha256", "f" * 64)],
)
def test_an_evaluation_is_never_rewritten(evaluation, column, value):
    with pytest.raises(DatabaseError, match=GUARD), transaction.atomic():
        Evaluation.objects.filter(pk=evaluation.pk).update(**{column: value})
    refused(f"UPDATE experiments_evaluation SET {column} = %s WHERE id = %s", [value, evaluation.pk])
    evaluation.refresh_from_db()
    assert (evaluation.score, evaluation.split, evaluation.correct) == (0.0, "final", 0)


def test_an_evaluation_keeps_its_checkpoint_and_benchmark(run, evaluation):
    other = CheckpointFactory()
    refused("UPDATE experiments_evaluation SET checkpoint_id = %s WHERE id = %s", [other.pk, evaluation.pk])
    refused("UPDATE experiments_evaluation SET benchmark_id = benchmark_id WHERE id = %s", [evaluation.pk])
    evaluation.refresh_from_db()
    assert evaluation.checkpoint_id == run.base_checkpoint_id


@pytest.mark.parametrize(
    ("column", "value"),
    [("manifest", '{"model.safetensors": "b"}'), ("manifest_sha256", "0" * 64), ("uri", "file:///elsewhere")],
)
def test_a_checkpoint_is_never_rewritten(run, column, value):
    checkpoint = run.base_checkpoint
    refused(f"UPDATE experiments_checkpoint SET {column} = %s WHERE id = %s", [value, checkpoint.pk])
    with pytest.raises(DatabaseError, match=GUARD), transaction.atomic():
        Checkpoint.objects.filter(pk=checkpoint.pk).update(manifest={"model.safetensors": "b" * 64})
    assert Checkpoint.objects.get(pk=checkpoint.pk).manifest == checkpoint.manifest


def test_the_feedback_score_is_set_once(experiment):
    # The pipeline fills it in once, when the feedback evaluation is recorded.
    Experiment.objects.filter(pk=experiment.pk).update(feedback_score=0.5)
    Experiment.objects.filter(pk=experiment.pk).update(feedback_score=0.5)  # the same value is no change
    with pytest.raises(DatabaseError, match=GUARD), transaction.atomic():
        Experiment.objects.filter(pk=experiment.pk).update(feedback_score=0.99)
    refused("UPDATE experiments_experiment SET feedback_score = NULL WHERE id = %s", [experiment.pk])
    experiment.refresh_from_db()
    assert experiment.feedback_score == 0.5


def test_an_experiments_recipe_input_and_output_are_frozen(run, experiment):
    produced, other = CheckpointFactory(parent=run.base_checkpoint), CheckpointFactory()
    refused("UPDATE experiments_experiment SET input_checkpoint_id = %s WHERE id = %s", [other.pk, experiment.pk])
    refused("UPDATE experiments_experiment SET action = %s WHERE id = %s", ['{"recipe": "dpo"}', experiment.pk])
    refused("UPDATE experiments_experiment SET kind = 'eval_only' WHERE id = %s", [experiment.pk])
    Experiment.objects.filter(pk=experiment.pk).update(output_checkpoint=produced)  # θ_out arrives once
    refused("UPDATE experiments_experiment SET output_checkpoint_id = %s WHERE id = %s", [other.pk, experiment.pk])
    experiment.refresh_from_db()
    assert (experiment.input_checkpoint_id, experiment.output_checkpoint_id) == (run.base_checkpoint_id, produced.pk)
    assert experiment.action == {"recipe": "sft"}


def test_the_integrity_status_changes_only_through_the_service(experiment):
    with pytest.raises(DatabaseError, match=GUARD), transaction.atomic():
        Experiment.objects.filter(pk=experiment.pk).update(integrity_status=IntegrityStatus.ACCEPTED)
    refused("UPDATE experiments_experiment SET integrity_status = 'accepted' WHERE id = %s", [experiment.pk])
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.PENDING

    services.experiment_set_integrity(experiment=experiment, status="flagged", actor="reviewer_0001", reason="leak")
    services.experiment_set_integrity(experiment=experiment, status="accepted", actor="user:root", reason="cleared")

    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED
    # An earlier history row cannot be spent again: flagged -> accepted is the newest change.
    refused("UPDATE experiments_experiment SET integrity_status = 'flagged' WHERE id = %s", [experiment.pk])
    refused("UPDATE experiments_experiment SET integrity_status = 'pending' WHERE id = %s", [experiment.pk])


def history_row(experiment: Experiment, to_status: str) -> IntegrityStatusChange:
    return IntegrityStatusChange.objects.create(
        experiment=experiment, from_status="pending", to_status=to_status, actor="me", reason="because"
    )


def check_deferred_now() -> None:
    """What COMMIT does: run the deferred checks now (a test's transaction never commits)."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def test_a_status_change_must_be_the_one_its_history_row_describes(experiment):
    def flag_under_a_row_that_says_accepted() -> None:
        history_row(experiment, "accepted")
        Experiment.objects.filter(pk=experiment.pk).update(integrity_status=IntegrityStatus.FLAGGED)

    with pytest.raises(DatabaseError, match=GUARD), transaction.atomic():
        flag_under_a_row_that_says_accepted()
    # The history needs who and why.
    for actor, reason in (("", "why"), ("who", "")):
        with pytest.raises(DatabaseError, match="integrity_change_has"), transaction.atomic():
            IntegrityStatusChange.objects.create(
                experiment=experiment, from_status="pending", to_status="flagged", actor=actor, reason=reason
            )
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.PENDING


@pytest.mark.skipif(connection.vendor != "postgresql", reason="deferred triggers are PostgreSQL's")
def test_the_history_row_and_the_change_commit_together(experiment):
    """At commit the status equals the newest history row: a row written without the change (to
    spend in a later transaction) fails, and so does an experiment inserted with another status."""

    def write_a_row_to_spend_later() -> None:
        history_row(experiment, "accepted")
        check_deferred_now()

    def insert_an_accepted_experiment() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO experiments_experiment (uuid, created_at, updated_at, run_id, handle, owner_id, kind, "
                "status, input_checkpoint_id, action, integrity_status, claim) SELECT gen_random_uuid(), now(), "
                "now(), run_id, 'exp_9999', owner_id, kind, status, input_checkpoint_id, action, 'accepted', '' "
                "FROM experiments_experiment WHERE id = %s",
                [experiment.pk],
            )
        check_deferred_now()

    with pytest.raises(DatabaseError, match=GUARD), transaction.atomic():
        write_a_row_to_spend_later()
    with pytest.raises(DatabaseError, match=GUARD), transaction.atomic():
        insert_an_accepted_experiment()
    # The service's path: the row and the change in one transaction pass the same check.
    with transaction.atomic():
        services.experiment_set_integrity(experiment=experiment, status="accepted", actor="auto", reason="clean")
        check_deferred_now()
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED
    assert not Experiment.objects.filter(handle="exp_9999").exists()


SQLITE_SCENARIO = """
from django.core.management import call_command
call_command("migrate", verbosity=0)
from apps.experiments.models import Evaluation
from apps.experiments.services import experiment_create, experiment_set_integrity
from apps.research.services import node_create
from tests.factories import make_run
run = make_run(name="sqlite")
worker = node_create(run=run, kind="worker", task="w")
experiment = experiment_create(
    run=run, owner=worker, kind="train_eval", input_checkpoint=run.base_checkpoint, action={"recipe": "sft"}
)
Evaluation.objects.create(run=run, experiment=experiment, checkpoint=run.base_checkpoint, benchmark=run.benchmark,
                          split="final", score=0.0, correct=0, sample_count=2)
experiment_set_integrity(experiment=experiment, status="flagged", actor="reviewer_0001", reason="leak")
print(experiment.pk)
"""


def test_sqlite_freezes_the_same_values(tmp_path: Path):
    made = run_python(SQLITE_SCENARIO, env=sqlite_env(tmp_path), timeout=180)
    pk = int(made.stdout.strip().splitlines()[-1])
    db = sqlite3.connect(tmp_path / "rsiweb.sqlite3")
    for statement in (
        "UPDATE experiments_evaluation SET score = 0.99",
        "UPDATE experiments_checkpoint SET manifest = '{}'",
        "UPDATE experiments_experiment SET integrity_status = 'accepted'",
        "UPDATE experiments_experiment SET action = '{}'",
    ):
        with pytest.raises(sqlite3.DatabaseError):
            db.execute(statement)
    db.execute("UPDATE experiments_experiment SET feedback_score = 0.5 WHERE id = ?", (pk,))  # set once
    with pytest.raises(sqlite3.DatabaseError, match="cannot change once set"):
        db.execute("UPDATE experiments_experiment SET feedback_score = 0.99 WHERE id = ?", (pk,))
    # With its history row the change goes through (SQLite checks the statement, not the commit).
    db.execute(
        "INSERT INTO experiments_integritystatuschange (created_at, updated_at, experiment_id, from_status, "
        "to_status, actor, reason) VALUES (datetime('now'), datetime('now'), ?, 'flagged', 'accepted', 'me', 'ok')",
        (pk,),
    )
    db.execute("UPDATE experiments_experiment SET integrity_status = 'accepted' WHERE id = ?", (pk,))
    assert db.execute("SELECT integrity_status FROM experiments_experiment WHERE id = ?", (pk,)).fetchone() == (
        "accepted",
    )
