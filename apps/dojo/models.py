"""RSI-Dojo: task environments (one build applies RSI-Craft's steps to a registry's tasks) and
agent-evaluation suites (agent configurations x base models x tasks, each cell a research run)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.core.models import UUIDModel
from apps.dojo.choices import BuildStatus, EnvironmentStatus, RejectionReason, SuiteStatus


class EnvironmentBuild(UUIDModel):
    """One run of the build pipeline over one task source, with the models and thresholds it used."""

    source = models.CharField(max_length=200)  # minibench-variants:arithmetic, folder:/path
    status = models.CharField(max_length=16, choices=BuildStatus.choices, default=BuildStatus.QUEUED)
    config = models.JSONField()  # CraftConfig as a dict
    # The two models the filters compare, by path and content hash (offline: θ0 and the reference).
    base_model = models.JSONField()  # {"path", "sha256"}
    strong_model = models.JSONField()
    job = models.OneToOneField("jobs.Job", on_delete=models.PROTECT, null=True, blank=True, related_name="dojo_build")
    summary = models.JSONField(default=dict, blank=True)  # kept / rejected counts by reason, seconds per task
    error = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=BuildStatus.values), name="dojo_build_status_valid")
        ]

    def __str__(self) -> str:
        return f"dojo build {self.uuid} ({self.source})"


class TaskEnvironment(UUIDModel):
    """One task after the filters: kept (a training environment) or rejected with the reason.

    ``sample_ids`` is frozen: a downsampled task keeps exactly these items for good.
    """

    build = models.ForeignKey(EnvironmentBuild, on_delete=models.PROTECT, related_name="environments")
    name = models.CharField(max_length=200)
    source = models.CharField(max_length=200)
    subset = models.CharField(max_length=200)
    contract = models.JSONField()  # evaluator, prompt_template, decoding, stop
    sample_ids = models.JSONField()
    sample_ids_sha256 = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=EnvironmentStatus.choices)
    reason = models.CharField(max_length=32, blank=True, choices=RejectionReason.choices)
    rejected_at = models.CharField(max_length=32, blank=True)  # the step that rejected it
    decisions = models.JSONField()  # every step's decision with its numbers, in order
    base_score = models.FloatField(null=True, blank=True)
    strong_score = models.FloatField(null=True, blank=True)
    seconds = models.FloatField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["build", "name"], name="dojo_env_name_unique_per_build"),
            models.CheckConstraint(condition=Q(status__in=EnvironmentStatus.values), name="dojo_env_status_valid"),
            models.CheckConstraint(
                condition=Q(status=EnvironmentStatus.KEPT, reason="")
                | Q(status=EnvironmentStatus.REJECTED, reason__in=RejectionReason.values),
                name="dojo_env_reason_matches_status",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status}{': ' + self.reason if self.reason else ''})"


class AgentSuite(UUIDModel):
    """Agent configurations x base models x tasks: one research run per cell (apps/dojo/suites.py).

    ``train_tasks`` names the tasks the agents were trained on; the suite's evaluation tasks were
    checked disjoint from them at creation (``overlap`` keeps what was compared, with its counts).
    ``budget`` is every cell's run budget (the run_launch arguments), the same for all cells.
    ``seeds`` repeats every cell once per run seed (empty: one cell, the budget's seed).
    """

    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=SuiteStatus.choices, default=SuiteStatus.CREATED)
    agents = models.JSONField()  # agent configuration names, in order (apps/dojo/agents.py)
    budget = models.JSONField()
    max_concurrent = models.PositiveSmallIntegerField(default=2)  # cells' runs active at once
    train_tasks = models.JSONField(default=list, blank=True)
    overlap = models.JSONField(default=dict, blank=True)  # the disjointness check's report
    seeds = models.JSONField(default=list, blank=True)  # run seeds, one cell each per setting
    # The periodic advance's clock (numbered ticks: a duplicated message runs once).
    advance_tick = models.PositiveIntegerField(default=0)
    advanced_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=SuiteStatus.values), name="dojo_suite_status_valid"),
            models.CheckConstraint(condition=Q(max_concurrent__gte=1), name="dojo_suite_concurrent_gte_1"),
        ]

    def __str__(self) -> str:
        return f"suite {self.name} ({self.uuid})"


class SuiteCell(UUIDModel):
    """One (agent configuration, base model, task, seed) of a suite: an ordinary research run."""

    suite = models.ForeignKey(AgentSuite, on_delete=models.PROTECT, related_name="cells")
    position = models.PositiveIntegerField()  # launch order
    agent = models.CharField(max_length=64)
    base_checkpoint = models.ForeignKey("experiments.Checkpoint", on_delete=models.PROTECT, related_name="+")
    benchmark = models.ForeignKey("benchmarks.Benchmark", on_delete=models.PROTECT, related_name="+")
    seed = models.IntegerField(default=0)  # the cell's run seed (run policy "seed")
    run = models.OneToOneField("research.Run", on_delete=models.PROTECT, related_name="suite_cell")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["suite", "position"], name="dojo_cell_position_unique"),
            models.UniqueConstraint(
                fields=["suite", "agent", "base_checkpoint", "benchmark", "seed"], name="dojo_cell_unique_per_suite"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent} x {self.base_checkpoint_id} x {self.benchmark_id} seed {self.seed}"
