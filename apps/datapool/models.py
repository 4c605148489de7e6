"""The datapool: content-addressed data shared across runs, with append-only readmes."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.core.models import BaseModel, UUIDModel


class DataFormat(models.TextChoices):
    SFT = "sft"  # {"prompt", "completion"}
    DPO = "dpo"  # {"prompt", "chosen", "rejected"}
    CHAT = "chat"  # {"messages", "tools", "metadata"}: agent trajectories (apps.dojo.export), TRL conversational


# What research agents may list and train the base model on: a chat entry is an agent's own
# trajectory (RSI-Dojo), training data for an agent model, never for the run's base model.
AGENT_FORMATS = (DataFormat.SFT, DataFormat.DPO)


class SourceKind(models.TextChoices):
    WORKSPACE = "workspace"
    CATALOG = "catalog"
    JOB = "job"
    HUB = "hub"
    EXPORT = "export"  # trajectories exported from recorded transcripts (apps.dojo.export)
    AGENT = "agent"  # bytes an agent made and sent in the call (worker_add_data content)


class DataEntry(UUIDModel):
    """A registered dataset file, stored in the artifact store under its sha256."""

    handle = models.CharField(max_length=32, unique=True)  # data_0007
    name = models.CharField(max_length=200)
    uri = models.CharField(max_length=1000)
    sha256 = models.CharField(max_length=64, unique=True)
    rows = models.PositiveIntegerField()
    size_bytes = models.PositiveBigIntegerField()
    format = models.CharField(max_length=8, choices=DataFormat.choices)
    schema = models.JSONField()  # column -> type
    source_kind = models.CharField(max_length=16, choices=SourceKind.choices)
    source = models.JSONField(default=dict)  # path / catalog name / job id / teacher
    teacher = models.CharField(max_length=200, blank=True)  # model that generated it, if any
    run = models.ForeignKey("research.Run", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    registered_by = models.ForeignKey(
        "research.ResearchNode", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    parents = models.ManyToManyField("self", symmetrical=False, blank=True, related_name="children")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(format__in=DataFormat.values), name="data_format_valid"),
            models.CheckConstraint(condition=Q(source_kind__in=SourceKind.values), name="data_source_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.handle} {self.name}"


class DataReadmeEntry(BaseModel):
    """A provenance note on a datapool entry. Append-only: the database refuses UPDATE/DELETE."""

    entry = models.ForeignKey(DataEntry, on_delete=models.PROTECT, related_name="readme_entries")
    author = models.CharField(max_length=200)
    text = models.TextField()


class DataUsage(BaseModel):
    """Which experiment used which entry, and how."""

    entry = models.ForeignKey(DataEntry, on_delete=models.PROTECT, related_name="usages")
    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.PROTECT, related_name="data_usages")
    purpose = models.CharField(max_length=16, default="train")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["entry", "experiment"], name="data_usage_unique")]
