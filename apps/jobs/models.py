"""Jobs: every accelerator or data action is a row with a status machine (STYLE.md)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.core.models import BaseModel, UUIDModel
from apps.jobs.choices import JobKind, JobStatus


class Job(UUIDModel):
    """One attempt at one job. The broker carries only this row's id; state lives here."""

    run = models.ForeignKey("research.Run", on_delete=models.PROTECT, null=True, blank=True, related_name="jobs")
    experiment = models.ForeignKey(
        "experiments.Experiment", on_delete=models.PROTECT, null=True, blank=True, related_name="jobs"
    )
    kind = models.CharField(max_length=16, choices=JobKind.choices)
    queue = models.CharField(max_length=32)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    spec = models.JSONField(default=dict)  # the validated inputs; enough to re-run the job
    result = models.JSONField(default=dict, blank=True)
    celery_id = models.CharField(max_length=64, blank=True)
    # When "look at job N" was last sent, and how often: the reaper re-sends a queued job that no
    # worker claimed for a while (its message may be lost), reusing celery_id; the claim dedups.
    published_at = models.DateTimeField(null=True, blank=True)
    publishes = models.PositiveSmallIntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True)  # hostname/pid that claimed it
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    progress = models.FloatField(default=0)
    metrics = models.JSONField(default=dict, blank=True)  # loss curve points, tokens/s
    resource_seconds = models.FloatField(default=0)
    attempt = models.PositiveSmallIntegerField(default=1)
    previous_attempt = models.OneToOneField(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="next_attempt"
    )
    cancel_requested = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    seed = models.BigIntegerField(default=0)
    versions = models.JSONField(default=dict, blank=True)  # package versions, code commit
    time_limit_seconds = models.PositiveIntegerField(default=3600)
    # Devices the job needs, all on one host (apps.ml.launch runs it on that many); the budget is
    # charged per device-second. `devices`: the indices on the claiming worker's host it holds.
    accelerators = models.PositiveSmallIntegerField(default=1)
    devices = models.JSONField(default=list, blank=True)
    # A queued multi-device job refused for want of free devices reserves the host it asked
    # (apps.jobs.services._devices_for): the devices that free there are kept for it. Only a
    # queued row holds a reservation; one per host.
    reserved_host = models.CharField(max_length=200, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=JobStatus.values), name="job_status_valid"),
            models.CheckConstraint(condition=Q(kind__in=JobKind.values), name="job_kind_valid"),
            models.CheckConstraint(condition=Q(attempt__gte=1), name="job_attempt_gte_1"),
            models.CheckConstraint(condition=Q(progress__gte=0) & Q(progress__lte=1), name="job_progress_0_1"),
            models.CheckConstraint(condition=Q(resource_seconds__gte=0), name="job_resource_seconds_gte_0"),
            models.CheckConstraint(
                condition=Q(accelerators__gte=1) & Q(accelerators__lte=8), name="job_accelerators_1_8"
            ),
            models.UniqueConstraint(
                fields=["reserved_host"],
                condition=Q(status=JobStatus.QUEUED) & ~Q(reserved_host=""),
                name="job_one_reservation_per_host",
            ),
            models.CheckConstraint(
                condition=Q(attempt=1, previous_attempt__isnull=True)
                | Q(attempt__gt=1, previous_attempt__isnull=False),
                name="job_attempt_chain",
            ),
        ]
        indexes = [models.Index(fields=["status", "heartbeat_at"], name="job_status_heartbeat_idx")]


class JobTransition(BaseModel):
    """Status history of a job (append-only)."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="transitions")
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16)
    reason = models.TextField(blank=True)


class JobLogLine(BaseModel):
    """A line of a job's log, for job_logs and the job page's log tail."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="log_lines")
    seq = models.PositiveIntegerField()
    text = models.TextField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="job_log_seq_unique")]
