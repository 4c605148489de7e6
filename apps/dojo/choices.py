from __future__ import annotations

from django.db import models


class BuildStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


BUILD_ACTIVE_STATES = (BuildStatus.QUEUED, BuildStatus.RUNNING)
BUILD_TERMINAL_STATES = (BuildStatus.SUCCEEDED, BuildStatus.FAILED)


class EnvironmentStatus(models.TextChoices):
    KEPT = "kept"
    REJECTED = "rejected"


class RejectionReason(models.TextChoices):
    """Why a task left the build; the same strings as apps.ml.craft's (a test keeps them equal)."""

    TOO_SMALL = "too_small"
    UNSTABLE = "unstable"
    METRIC_IGNORES_OUTPUT = "metric_ignores_output"
    TOO_EASY = "too_easy"
    TOO_HARD = "too_hard"
    NOT_DISCRIMINATIVE = "not_discriminative"


class SuiteStatus(models.TextChoices):
    """An agent-evaluation suite: created, running its cells' runs, finished when every run ended."""

    CREATED = "created"
    RUNNING = "running"
    FINISHED = "finished"


class CellStatus(models.TextChoices):
    """One cell of a suite, read from its run: queued (created), running (active), or ended."""

    QUEUED = "queued"
    RUNNING = "running"
    ENDED = "ended"
