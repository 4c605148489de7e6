"""The create path checks fields in Python and leaves unique and check constraints to the database."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.experiments import services
from apps.experiments.models import Experiment
from apps.jobs import services as job_services
from apps.jobs.models import Job
from apps.research import services as research_services
from apps.research.choices import NodeKind

pytestmark = pytest.mark.django_db


@pytest.fixture
def worker(run):
    return research_services.node_create(run=run, kind=NodeKind.WORKER, task="w")


def _create(run, worker, **overrides):
    fields = {"kind": "eval_only", "input_checkpoint": run.base_checkpoint, "action": {"evaluate": "feedback"}}
    return services.experiment_create(run=run, owner=worker, **{**fields, **overrides})


def test_field_errors_are_still_validation_errors(run, worker):
    with pytest.raises(ValidationError) as refused:
        _create(run, worker, kind="not_a_kind")
    assert "kind" in refused.value.message_dict
    with pytest.raises(ValidationError):
        _create(run, worker, idempotency_key="k" * 201)
    assert not Experiment.objects.filter(run=run).exists()


def test_the_database_still_refuses_what_the_constraints_forbid(run, worker):
    _create(run, worker, idempotency_key="retry-1")
    with pytest.raises(IntegrityError), transaction.atomic():
        _create(run, worker, idempotency_key="retry-1")  # experiment_idempotency_unique
    experiment = _create(run, worker)
    first = job_services.job_enqueue(kind="evaluate", spec={"checkpoint": "c"}, experiment=experiment)
    retry = {"kind": "evaluate", "spec": first.spec, "run": run, "experiment": experiment, "queue": "gpu", "seed": 0}
    job_services._create(**retry, time_limit_seconds=60, previous_attempt=first, reason="attempt 2")
    with pytest.raises(IntegrityError), transaction.atomic():  # one retry per attempt (a unique key)
        job_services._create(**retry, time_limit_seconds=60, previous_attempt=first, reason="attempt 2 again")
    with pytest.raises(ValidationError):  # a field's own bounds are still checked before the INSERT
        job_services._create(**retry, time_limit_seconds=-1, reason="negative time")
    assert Experiment.objects.filter(run=run).count() == 2
    assert Job.objects.filter(experiment=experiment).count() == 2


def test_creating_an_experiment_and_its_job_runs_no_constraint_queries(run, worker):
    with CaptureQueriesContext(connection) as queries:
        experiment = _create(run, worker)
        job_services.job_enqueue(kind="evaluate", spec={"checkpoint": "c"}, experiment=experiment)
    statements = [q["sql"] for q in queries]
    assert not [s for s in statements if '"_check"' in s or s.startswith('SELECT 1 AS "a"')], statements
