"""factory_boy factories for the domain records (STYLE.md 29)."""

from __future__ import annotations

import factory

from apps.benchmarks.models import Benchmark
from apps.core.hashing import sha256_text
from apps.experiments.models import Checkpoint
from apps.research import services as research_services


class BenchmarkFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Benchmark

    name = factory.Sequence(lambda n: f"test/bench-{n}")
    task = "arithmetic"
    evaluator = "exact_match"
    evaluator_sha256 = sha256_text("evaluator")
    settings = factory.LazyFunction(lambda: {"prompt_template": "{question}", "decoding": {"max_new_tokens": 8}})
    settings_sha256 = sha256_text("settings")
    sealed_path = "/nonexistent/sealed"
    data_sha256 = factory.LazyFunction(lambda: {"feedback": "0" * 64, "final": "1" * 64})
    sample_ids = factory.LazyFunction(lambda: {"feedback": ["f1", "f2"], "final": ["x1", "x2"]})


class CheckpointFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Checkpoint

    handle = factory.Sequence(lambda n: f"test_ckpt_{n:05d}")
    uri = factory.LazyAttribute(lambda o: f"file:///tmp/{o.handle}")
    manifest = factory.LazyFunction(lambda: {"model.safetensors": "a" * 64})
    manifest_sha256 = factory.LazyAttribute(lambda o: sha256_text(str(o.manifest)))
    is_base = False


def make_run(*, name: str = "test run", benchmark: Benchmark | None = None, **overrides):
    """A run through the real service (so its Main node and first event exist)."""
    benchmark = benchmark or BenchmarkFactory()
    base = overrides.pop("base_checkpoint", None) or CheckpointFactory(is_base=True)
    defaults = dict(
        budget_wall_seconds=3600,
        budget_accelerator_seconds=3600,
        budget_llm_tokens=1_000_000,
        target_capability="add two-digit numbers",
    )
    defaults.update(overrides)
    return research_services.run_create(name=name, benchmark=benchmark, base_checkpoint=base, **defaults)
