from __future__ import annotations

from django.db import models


class IntegrityStatus(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"
    FLAGGED = "flagged"


class ExperimentKind(models.TextChoices):
    TRAIN_EVAL = "train_eval"  # train on θ_in, then evaluate on feedback
    EVAL_ONLY = "eval_only"  # evaluate an existing checkpoint on feedback


class ExperimentStatus(models.TextChoices):
    HELD = "held"  # waiting at the training gate
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"  # refused at the training gate


EXPERIMENT_ACTIVE_STATES = (ExperimentStatus.HELD, ExperimentStatus.QUEUED, ExperimentStatus.RUNNING)
EXPERIMENT_TERMINAL_STATES = (
    ExperimentStatus.SUCCEEDED,
    ExperimentStatus.FAILED,
    ExperimentStatus.CANCELLED,
    ExperimentStatus.REJECTED,
)


class EvaluationStatus(models.TextChoices):
    OK = "ok"
    REFUSED = "refused"  # sealed hashes did not verify; nothing was run
