"""factory_boy factories for the domain records (STYLE.md 29), and factories over the services."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import factory

from apps.benchmarks.models import Benchmark
from apps.core.hashing import sha256_text
from apps.datapool.services import data_register_upload
from apps.experiments.models import Checkpoint, Evaluation
from apps.experiments.services import checkpoint_register
from apps.flows.pipeline import evaluation_spec, experiment_start
from apps.flows.runs import run_final_eval_start, run_finish, run_stop_request
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job
from apps.jobs.services import job_claim, job_enqueue, job_report, job_succeed, job_succeed_with_evaluation
from apps.research import services as research_services
from apps.research.models import Run


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


# --- factories over the services: the rows a worker's job leaves, through the job engine ----------
#
# A test world built with these holds only states the services produce: a training or evaluation
# job is enqueued (by the pipeline, or here for the run's own evaluations), claimed by a named
# worker, and ends through the job engine's services, which advance the experiment as a worker's
# report would. Only the work itself is left out: no model is trained or run, the rows are given.


def seal_for(split: str) -> dict[str, str]:
    """What benchmark_load_sealed would have verified (evaluator, settings and data hashes)."""
    return {
        "evaluator_sha256": sha256_text("evaluator"),
        "settings_sha256": sha256_text("settings"),
        "data_sha256": sha256_text(f"data-{split}"),
    }


def scored_rows(ids: list[str], right: set[str] | int, *, output: str = "42", wrong: str = "0") -> list[dict]:
    """Per-sample rows of an evaluation: ``right`` the ids answered right (or how many of the first)."""
    if isinstance(right, int):
        right = set(ids[:right])
    return [{"id": i, "output": output if i in right else wrong, "correct": i in right} for i in ids]


def job_evaluated(
    job, *, checkpoint, split: str, rows: list[dict], worker: str = "gpu@host-a", log_lines: list[str] = ()
):
    """An evaluation job claimed by ``worker``, logging ``log_lines`` and succeeding with ``rows``; its Evaluation."""
    claimed = job_claim(job_id=job.pk, worker=worker)
    for line in log_lines:
        job_report(job=claimed, log_line=line)
    job_succeed_with_evaluation(
        job=claimed, checkpoint=checkpoint, benchmark=job.run.benchmark, split=split, rows=rows, backend="hf",
        seal=seal_for(split),
    )  # fmt: skip
    return Evaluation.objects.get(job=job)


def evaluation_made(run, *, checkpoint, split: str, rows: list[dict], experiment=None, worker: str = "gpu@host-a"):
    """An evaluation job of ``run`` (of ``experiment`` when given) enqueued and run to its end."""
    job = job_enqueue(
        kind=JobKind.EVALUATE, spec=evaluation_spec(checkpoint=checkpoint, benchmark=run.benchmark, split=split),
        run=run, experiment=experiment,
    )  # fmt: skip
    return job_evaluated(job, checkpoint=checkpoint, split=split, rows=rows, worker=worker)


def training_succeed(job, *, weights: str, result: dict[str, Any] | None = None) -> Checkpoint:
    """A running training job ends as a worker ends it: its checkpoint registered, the job succeeded
    (the pipeline then records the experiment's output and queues its feedback evaluation)."""
    experiment = job.experiment
    checkpoint = checkpoint_register(
        uri=f"file:///tmp/nowhere/{experiment.handle}", parent=experiment.input_checkpoint, producing_job=job,
        run=experiment.run, manifest={"model.safetensors": weights, "config.json": "c" * 64},
    )  # fmt: skip
    job_succeed(job=job, result=result or {})
    return checkpoint


def experiment_trained(experiment, *, weights: str, points: list[dict[str, float]] = (), worker: str = "gpu@host-a"):
    """Start ``experiment`` (the pipeline enqueues its training), let ``worker`` claim it, stream
    ``points`` and succeed with a checkpoint of ``weights``; ``(training job, θ_out)``."""
    job = job_claim(job_id=experiment_start(experiment=experiment).pk, worker=worker)
    for point in points:
        job_report(job=job, metrics_point=point, log_line=f"step {point['step']}: loss={point['loss']}")
    job_report(job=job, progress=1.0)
    result = {"steps": int(points[-1]["step"])} if points else {}
    checkpoint = training_succeed(job, weights=weights, result=result)
    return Job.objects.get(pk=job.pk), checkpoint


def feedback_succeed(experiment, *, rows: list[dict], worker: str = "gpu@host-a"):
    """The feedback evaluation the pipeline queued for ``experiment`` runs and succeeds (the experiment with it)."""
    experiment.refresh_from_db()
    job = Job.objects.get(experiment=experiment, kind=JobKind.EVALUATE, status=JobStatus.QUEUED)
    checkpoint = experiment.output_checkpoint or experiment.input_checkpoint
    return job_evaluated(job, checkpoint=checkpoint, split="feedback", rows=rows, worker=worker)


def data_uploaded(*, node, name: str, rows: int = 4):
    """A small SFT data entry uploaded by ``node`` (an agent's upload, through the datapool's service)."""
    content = "".join(  # the run's id in each row: two runs' uploads are two entries
        json.dumps({"prompt": f"Run {node.run_id}: what is {i} plus {i}?", "completion": str(2 * i)}) + "\n"
        for i in range(rows)
    ).encode()
    return data_register_upload(
        content=content, sha256=hashlib.sha256(content).hexdigest(), size=len(content), name=name,
        generator="a test's arithmetic", run=node.run, node=node,
    )  # fmt: skip


def run_finished(run, *, final_rows: dict[str, list[dict]], actor: str = "main"):
    """End ``run`` as the system does: stop, the final evaluation jobs with ``final_rows[role]``
    (θ0, reference, best, candidate; a role not given scores nothing right of 20), finish."""
    run = run_final_eval_start(run=run_stop_request(run=run, reason="test: end the run", actor=actor))
    for job in Job.objects.filter(run=run, kind=JobKind.FINAL_EVAL).order_by("pk"):
        role = next((r for r in job.spec["roles"] if r != "candidate"), "candidate")
        rows = final_rows.get(role) or scored_rows([f"x{i:03d}" for i in range(20)], 0)
        checkpoint = Checkpoint.objects.get(uuid=job.spec["checkpoint"])
        job_evaluated(job, checkpoint=checkpoint, split="final", rows=rows, worker="gpu@test")
    return run_finish(run=Run.objects.get(pk=run.pk))
