"""Experiment, evaluation and job services announce their own changes, after commit, with the selector's record.

Each test calls the real service while a test channel listens on the run's group (and the job's)
on the channel layer the app is configured with, and compares what arrives with the record the
selector builds now. Nothing here publishes (STYLE.md 31a): a service that forgets to announce a
change fails here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.test import override_settings

from apps.experiments.choices import ExperimentStatus, IntegrityStatus
from apps.experiments.models import Evaluation, Experiment
from apps.experiments.selectors import evaluation_live, experiment_live
from apps.experiments.services import experiment_create, experiment_set_integrity
from apps.flows.pipeline import experiment_set_status
from apps.flows.submissions import training_decide
from apps.jobs.models import Job
from apps.jobs.selectors import job_payload
from apps.jobs.services import job_claim, job_enqueue, job_refuse_evaluation, job_succeed_with_evaluation
from apps.live.events import LiveEvent
from apps.live.groups import job_group, run_group
from apps.live.layers import SQLiteChannelLayer
from apps.research import services as research_services
from apps.research.choices import NodeKind

pytestmark = pytest.mark.django_db(transaction=True)

SEAL = {"evaluator_sha256": "e" * 64, "settings_sha256": "s" * 64, "data_sha256": "d" * 64}


class Listener:
    """A test channel in some groups; ``events()`` drains what arrived (event type, payload)."""

    def __init__(self, layer: SQLiteChannelLayer) -> None:
        self.layer = layer
        self.channel = async_to_sync(layer.new_channel)()

    def join(self, group: str) -> None:
        async_to_sync(self.layer.group_add)(group, self.channel)

    def events(self, quiet: float = 0.3) -> list[tuple[str, dict[str, Any]]]:
        async def drain() -> list[dict[str, Any]]:
            messages = []
            while True:
                try:
                    messages.append(await asyncio.wait_for(self.layer.receive(self.channel), quiet))
                except TimeoutError:
                    return messages

        return [(m["event"], m["payload"]) for m in async_to_sync(drain)()]

    def of(self, event: LiveEvent) -> list[dict[str, Any]]:
        return [payload for kind, payload in self.events() if kind == event]


@pytest.fixture
def listener(tmp_path):
    path = str(tmp_path / "channels.sqlite3")
    config = {"default": {"BACKEND": "apps.live.layers.SQLiteChannelLayer", "CONFIG": {"path": path}}}
    with override_settings(CHANNEL_LAYERS=config):
        yield Listener(SQLiteChannelLayer(path=path, poll_interval=0.01))


@pytest.fixture
def worker(run):
    return research_services.node_create(run=run, kind=NodeKind.WORKER, task="w")


def _experiment(run, worker, **overrides: Any) -> Experiment:
    fields = {"kind": "eval_only", "input_checkpoint": run.base_checkpoint, "action": {"evaluate": "feedback"}}
    return experiment_create(run=run, owner=worker, **{**fields, **overrides})


def _running_evaluation(run, worker) -> Job:
    experiment = _experiment(run, worker)
    job = job_enqueue(kind="evaluate", spec={"checkpoint": str(run.base_checkpoint.uuid)}, experiment=experiment)
    return job_claim(job_id=job.pk, worker="gpu@test")


def _fresh(record: Callable[[Any], dict[str, Any]], obj: Any) -> dict[str, Any]:
    # Through JSON, as the event was: UUIDs and datetimes become strings.
    return json.loads(json.dumps(record(obj), cls=DjangoJSONEncoder))


def test_experiment_create_announces_the_new_experiment(run, worker, listener):
    listener.join(run_group(run.uuid))

    experiment = _experiment(run, worker)

    assert listener.of(LiveEvent.EXPERIMENT_CREATED) == [_fresh(experiment_live, experiment)]


def _create_then_fail(run, worker) -> None:
    with transaction.atomic():
        _experiment(run, worker)
        raise RuntimeError("the caller failed")


def test_nothing_is_announced_when_the_transaction_rolls_back(run, worker, listener):
    listener.join(run_group(run.uuid))

    with pytest.raises(RuntimeError):
        _create_then_fail(run, worker)

    assert listener.events() == []


def test_a_status_change_announces_the_experiment(run, worker, listener):
    experiment = _experiment(run, worker)
    listener.join(run_group(run.uuid))

    with transaction.atomic():
        locked = Experiment.objects.select_for_update().select_related("run").get(pk=experiment.pk)
        experiment_set_status(experiment=locked, status=ExperimentStatus.RUNNING, reason="test")

    [payload] = listener.of(LiveEvent.EXPERIMENT_UPDATED)
    assert payload == _fresh(experiment_live, experiment)
    assert payload["status"] == ExperimentStatus.RUNNING


def test_an_integrity_status_change_announces_the_experiment(run, worker, listener):
    experiment = _experiment(run, worker)
    listener.join(run_group(run.uuid))

    experiment_set_integrity(experiment=experiment, status=IntegrityStatus.FLAGGED, actor="reviewer", reason="why")

    [payload] = listener.of(LiveEvent.EXPERIMENT_UPDATED)
    assert payload == _fresh(experiment_live, experiment)
    assert payload["integrity_status"] == IntegrityStatus.FLAGGED


def test_the_training_gate_decision_announces_the_experiment(run, worker, listener):
    held = _experiment(run, worker, kind="train_eval", status=ExperimentStatus.HELD)
    listener.join(run_group(run.uuid))

    training_decide(run=run, actor="main", role="main", experiment=held.handle, decision="reject", rationale="no")

    [payload] = listener.of(LiveEvent.EXPERIMENT_UPDATED)
    assert payload == _fresh(experiment_live, held)
    assert payload["status"] == ExperimentStatus.REJECTED


def test_a_job_announces_itself_to_its_run_and_its_own_group(run, worker, listener):
    experiment = _experiment(run, worker)
    listener.join(run_group(run.uuid))

    job = job_enqueue(kind="evaluate", spec={"checkpoint": "c"}, experiment=experiment)
    listener.join(job_group(job.uuid))  # the run group already got the enqueue; the claim reaches both
    job_claim(job_id=job.pk, worker="gpu@test")

    events = listener.events()
    fresh = _fresh(job_payload, Job.objects.select_related("experiment").get(pk=job.pk))
    updates = [payload for kind, payload in events if kind == LiveEvent.JOB_UPDATED]
    assert updates[0]["status"] == "queued"
    assert updates[-2:] == [fresh, fresh]  # the claim, once per group


def test_a_recorded_evaluation_announces_itself_and_the_experiments_score(run, worker, listener):
    job = _running_evaluation(run, worker)
    listener.join(run_group(run.uuid))

    job_succeed_with_evaluation(
        job=job,
        checkpoint=run.base_checkpoint,
        benchmark=run.benchmark,
        split="feedback",
        rows=[{"id": "f1", "output": "3", "correct": True}, {"id": "f2", "output": "4", "correct": False}],
        backend="hf",
        seal=SEAL,
    )

    events = listener.events()
    evaluation = Evaluation.objects.get(job=job)
    assert [p for k, p in events if k == LiveEvent.EVALUATION_CREATED] == [_fresh(evaluation_live, evaluation)]
    assert evaluation_live(evaluation)["score"] == 0.5
    experiment = [p for k, p in events if k == LiveEvent.EXPERIMENT_UPDATED][-1]
    assert experiment == _fresh(experiment_live, job.experiment)
    assert (experiment["status"], experiment["feedback_score"]) == (ExperimentStatus.SUCCEEDED, 0.5)


def test_a_refused_evaluation_announces_itself(run, worker, listener):
    job = _running_evaluation(run, worker)
    listener.join(run_group(run.uuid))

    job_refuse_evaluation(
        job=job, checkpoint=run.base_checkpoint, benchmark=run.benchmark, split="feedback", reason="seal broken"
    )

    [payload] = listener.of(LiveEvent.EVALUATION_CREATED)
    assert payload == _fresh(evaluation_live, Evaluation.objects.get(job=job))
    assert (payload["status"], payload["refusal_reason"], payload["score"]) == ("refused", "seal broken", None)
