from __future__ import annotations

from django.db import models


class JobKind(models.TextChoices):
    TRAIN = "train"
    EVALUATE = "evaluate"
    DATA = "data"
    FINAL_EVAL = "final_eval"


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"  # the worker died; attempt N+1 was queued


JOB_ACTIVE_STATES = (JobStatus.QUEUED, JobStatus.RUNNING)
JOB_TERMINAL_STATES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.LOST)
