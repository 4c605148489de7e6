from __future__ import annotations

from django.db import models


class JobKind(models.TextChoices):
    TRAIN = "train"
    EVALUATE = "evaluate"
    DATA = "data"
    FINAL_EVAL = "final_eval"
    DOJO_BUILD = "dojo_build"  # RSI-Dojo task-environment build (apps.dojo)
    AGENT_SFT = "agent_sft"  # fine-tune an agent model on trajectories


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"  # the worker died; attempt N+1 was queued


JOB_ACTIVE_STATES = (JobStatus.QUEUED, JobStatus.RUNNING)
JOB_TERMINAL_STATES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.LOST)
