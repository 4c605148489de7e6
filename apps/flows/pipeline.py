"""The experiment pipeline: train on θ_in, then evaluate θ_out on the sealed feedback split.

One experiment runs as a sequence of Job rows. The next step is enqueued by the service that
records a job's success (``experiment_on_job_transition``, which apps.flows.apps registers in
apps.jobs.hooks, so the job engine calls it inside that transaction without importing it), not
by a Celery chain: the database decides what happens next, so a lost attempt re-run as attempt
N+1 continues the pipeline exactly as the first attempt would have, and nothing is enqueued twice.

Action schema of a ``train_eval`` experiment (what ``worker_submit`` stores in ``action``)::

    {"data": ["<datapool entry uuid or handle>", ...], "hyperparameters": {...TrainConfig...}}

``eval_only`` needs no action: it evaluates ``input_checkpoint``.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.core.errors import ApplicationError, Conflict
from apps.datapool.selectors import data_entry_get
from apps.datapool.services import data_usage_record
from apps.experiments.choices import EXPERIMENT_TERMINAL_STATES, ExperimentKind, ExperimentStatus
from apps.experiments.events import event_append
from apps.experiments.models import Checkpoint, Experiment
from apps.experiments.services import experiment_publish
from apps.integrity.services import integrity_on_experiment_finished
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job
from apps.jobs.services import job_enqueue
from apps.ml.hparams import validate_train_config

FEEDBACK_SPLIT = "feedback"
# Evaluation batch size for the CPU backend: batching is 10-50x faster than one by one here.
EVAL_BATCH_SIZE = 32


def _resolve_data(refs: Any) -> list[Any]:
    if not isinstance(refs, list) or not refs:
        raise ApplicationError(
            "no_training_data", "A training experiment needs action.data: a non-empty list of datapool entries."
        )
    return [data_entry_get(str(ref)) for ref in refs]


def train_job_spec(*, input_checkpoint: Checkpoint, data: list[Any], hyperparameters: dict[str, Any]) -> dict[str, Any]:
    """A train job's inputs, validated now so a bad recipe costs no compute.

    ``data`` are datapool entries; their sha256 is pinned in the spec, so the worker refuses a
    file whose bytes changed since submission.
    """
    try:
        validate_train_config(hyperparameters)
    except ValueError as exc:
        raise ApplicationError("invalid_hyperparameters", str(exc)) from None
    if not data:
        raise ApplicationError("no_training_data", "A training job needs at least one datapool entry.")
    return {
        "input_checkpoint": str(input_checkpoint.uuid),
        "data": [{"uuid": str(e.uuid), "handle": e.handle, "uri": e.uri, "sha256": e.sha256} for e in data],
        "hyperparameters": hyperparameters,
    }


def evaluation_spec(*, checkpoint: Checkpoint, benchmark: Any, split: str = FEEDBACK_SPLIT) -> dict[str, Any]:
    return {
        "checkpoint": str(checkpoint.uuid),
        "benchmark": str(benchmark.uuid),
        "split": split,
        "batch_size": EVAL_BATCH_SIZE,
        # No "backend": the evaluation worker's configuration chooses the engine (apps.ml.engines).
    }


def experiment_start(*, experiment: Experiment) -> Job:
    """Enqueue the experiment's first job (train, or evaluate for eval_only) and return it.

    Idempotent: an experiment that already has jobs returns its newest one. Only a ``queued``
    experiment starts (a ``held`` one waits for the training gate).
    """
    with transaction.atomic():
        # Locked so two callers cannot both see "no job yet" and start it twice. The benchmark
        # (for an evaluation's spec) comes in the same query but is not locked.
        locked = (
            Experiment.objects.select_for_update(of=("self", "run", "input_checkpoint"))
            .select_related("run__benchmark", "input_checkpoint")
            .get(pk=experiment.pk)
        )
        existing = Job.objects.filter(experiment=locked).order_by("-pk").first()
        if existing is not None:
            return existing
        if locked.status != ExperimentStatus.QUEUED:
            raise Conflict(
                "experiment_not_queued", f"Experiment {locked.handle} is {locked.status}; only a queued one starts."
            )
        if locked.kind == ExperimentKind.TRAIN_EVAL:
            entries = _resolve_data(locked.action.get("data"))
            hyperparameters = locked.action.get("hyperparameters", {})
            spec = train_job_spec(
                input_checkpoint=locked.input_checkpoint, data=entries, hyperparameters=hyperparameters
            )
            for entry in entries:
                data_usage_record(entry=entry, experiment=locked, purpose="train")
            seed = int(spec["hyperparameters"].get("seed", 0))
            accelerators = int(locked.action.get("accelerators", 1))
            return job_enqueue(kind=JobKind.TRAIN, spec=spec, experiment=locked, seed=seed, accelerators=accelerators)
        if locked.kind == ExperimentKind.EVAL_ONLY:
            spec = evaluation_spec(checkpoint=locked.input_checkpoint, benchmark=locked.run.benchmark)
            return job_enqueue(kind=JobKind.EVALUATE, spec=spec, experiment=locked)
        raise ApplicationError("invalid_experiment_kind", f"Unknown experiment kind {locked.kind!r}.")


def experiment_set_status(
    *,
    experiment: Experiment,
    status: str,
    reason: str,
    fields: list[str] | None = None,
    actor: str = "system",
    role: str = "system",
) -> None:
    """Move an experiment (locked by the caller) to ``status``, saving ``fields`` with it; recorded and published.

    A submission that ran to an end gets its integrity checks (queued on commit).
    """
    previous = experiment.status
    experiment.status = status
    experiment.save(update_fields=["status", "updated_at", *(fields or [])])
    event_append(
        run=experiment.run,
        type="experiment.status_changed",
        actor=actor,
        role=role,
        arguments={"from": previous, "to": status, "reason": reason},
        result_ref=f"experiment:{experiment.uuid}",
    )
    if status in (ExperimentStatus.SUCCEEDED, ExperimentStatus.FAILED, ExperimentStatus.CANCELLED):
        # The submission ran: its post-checks fill the observation layer (queued on commit).
        integrity_on_experiment_finished(experiment=experiment)
    experiment_publish(experiment)


def experiment_on_job_transition(*, job: Job) -> None:
    """Advance the experiment after one of its jobs changed status (inside that transaction).

    running  -> the experiment runs; train succeeded -> θ_out recorded, evaluation enqueued;
    evaluation succeeded -> feedback score recorded, experiment succeeded; failed/cancelled ->
    the experiment ends so; lost -> it waits for attempt N+1, or fails when none was queued.
    """
    if job.experiment_id is None:
        return  # a job of no experiment (a final evaluation, a data job): nothing to advance
    experiment = Experiment.objects.select_for_update().select_related("run").get(pk=job.experiment_id)
    if experiment.status in EXPERIMENT_TERMINAL_STATES:
        return
    status = job.status
    if status == JobStatus.RUNNING:
        if experiment.status == ExperimentStatus.QUEUED:
            experiment_set_status(
                experiment=experiment,
                status=ExperimentStatus.RUNNING,
                reason=f"{job.kind} job attempt {job.attempt} started",
            )
    elif status == JobStatus.SUCCEEDED and job.kind == JobKind.TRAIN:
        checkpoint = Checkpoint.objects.get(producing_job=job)
        experiment.output_checkpoint = checkpoint
        experiment.save(update_fields=["output_checkpoint", "updated_at"])
        experiment_publish(experiment)
        job_enqueue(
            kind=JobKind.EVALUATE,
            spec=evaluation_spec(checkpoint=checkpoint, benchmark=experiment.run.benchmark),
            experiment=experiment,
            seed=job.seed,
        )
    elif status == JobStatus.SUCCEEDED and job.kind in (JobKind.EVALUATE, JobKind.FINAL_EVAL):
        evaluation = job.evaluation
        if evaluation.split == FEEDBACK_SPLIT:
            experiment.feedback_score = evaluation.score
        reason = f"evaluated: {evaluation.correct}/{evaluation.sample_count} correct"
        experiment_set_status(
            experiment=experiment, status=ExperimentStatus.SUCCEEDED, reason=reason, fields=["feedback_score"]
        )
    elif status == JobStatus.FAILED:
        experiment_set_status(
            experiment=experiment,
            status=ExperimentStatus.FAILED,
            reason=f"{job.kind} job failed: {job.error.strip()[-300:]}",
        )
    elif status == JobStatus.CANCELLED:
        experiment_set_status(
            experiment=experiment, status=ExperimentStatus.CANCELLED, reason=f"{job.kind} job cancelled"
        )
    elif status == JobStatus.LOST and not Job.objects.filter(previous_attempt=job).exists():
        experiment_set_status(
            experiment=experiment,
            status=ExperimentStatus.FAILED,
            reason=f"{job.kind} job lost on attempt {job.attempt}; no attempts left",
        )
