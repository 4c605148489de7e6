"""Sealed benchmarks: evaluator code, data and inference settings, each hashed at registration."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.core.models import UUIDModel


class Split(models.TextChoices):
    FEEDBACK = "feedback"  # aggregates go back to Workers during the run
    FINAL = "final"  # run by the system at the end; the reported score


class Benchmark(UUIDModel):
    """One capability's sealed evaluator. Data lives under ``sealed_path``, outside the artifact store."""

    name = models.CharField(max_length=200)  # e.g. minibench/arithmetic
    version = models.PositiveIntegerField(default=1)
    task = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    evaluator = models.CharField(max_length=64)  # exact_match | multiple_choice | json_call
    evaluator_sha256 = models.CharField(max_length=64)
    settings = models.JSONField()  # prompt template, decoding, stop/EOS
    settings_sha256 = models.CharField(max_length=64)
    sealed_path = models.CharField(max_length=1000)
    data_sha256 = models.JSONField()  # {"feedback": sha, "final": sha}
    sample_ids = models.JSONField()  # {"feedback": [...], "final": [...]}: sample-inclusion accounting
    # The explicit contract (apps/benchmarks/contract.py): adapter, code and package hashes, prompt,
    # decoding, sample ids, metric. Empty on rows registered before contracts existed.
    contract = models.JSONField(default=dict, blank=True)
    contract_sha256 = models.CharField(max_length=64, blank=True)
    reference_checkpoint = models.ForeignKey(
        "experiments.Checkpoint", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="benchmark_name_version_unique"),
            models.CheckConstraint(condition=Q(version__gte=1), name="benchmark_version_gte_1"),
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"
