"""The experiment pipeline: train on θ_in, then evaluate on the sealed feedback split.

The first tests drive the chain through the services (fast, no worker); the last three run it on
a real worker, including an evaluation refused because a sealed file was tampered with and one
scored by the benchmark's sealed evaluator copy rather than the worker's own evaluators.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import torch
import transformers

from apps.benchmarks.services import benchmark_register, checkpoint_local_dir
from apps.core.errors import ApplicationError, NotFound
from apps.core.hashing import sha256_tree
from apps.datapool.models import DataUsage
from apps.experiments.choices import EvaluationStatus, ExperimentStatus
from apps.experiments.models import Checkpoint, Evaluation, EvaluationSample, Event, Experiment
from apps.experiments.services import experiment_create
from apps.flows.pipeline import evaluation_spec, experiment_start
from apps.jobs import services
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job, JobLogLine
from apps.ml import evaluators
from apps.research.choices import NodeKind
from apps.research.models import Run
from apps.research.services import node_create
from tests.apps.jobs.conftest import wait_for
from tests.factories import make_run

FAST_RECIPE = {"max_steps": 30, "batch_size": 16, "logging_steps": 10}


@pytest.fixture
def benchmark(minibench_dir, artifact_root):
    return benchmark_register(name="minibench/arithmetic", task_dir=minibench_dir / "tasks" / "arithmetic")


def new_experiment(run, *, kind="train_eval", action=None, status="queued") -> Experiment:
    owner = node_create(run=run, kind=NodeKind.WORKER, task="teach arithmetic")
    action = action or {"evaluate": "feedback"}  # eval_only: no recipe, just what to evaluate
    return experiment_create(
        run=run, owner=owner, kind=kind, input_checkpoint=run.base_checkpoint, action=action, status=status
    )


def experiment_events(experiment: Experiment) -> list[str]:
    return [
        e.arguments["to"]
        for e in Event.objects.filter(type="experiment.status_changed", result_ref=f"experiment:{experiment.uuid}")
        .order_by("seq")
    ]  # fmt: skip


# --- the chain through the services -------------------------------------------------------------


@pytest.mark.django_db
def test_start_refuses_a_bad_recipe_or_unknown_data_before_any_job_exists(theta0, benchmark, data_entry):
    run = make_run(base_checkpoint=theta0, benchmark=benchmark)
    entry = data_entry(rows=50)
    bad_lr = new_experiment(run, action={"data": [entry.handle], "hyperparameters": {"learning_rate": -0.1}})
    unknown = new_experiment(run, action={"data": ["data_9999"], "hyperparameters": FAST_RECIPE})
    held = new_experiment(run, action={"data": [entry.handle], "hyperparameters": FAST_RECIPE}, status="held")

    with pytest.raises(ApplicationError) as error:
        experiment_start(experiment=bad_lr)
    assert error.value.code == "invalid_hyperparameters"
    assert "learning_rate" in error.value.message
    with pytest.raises(NotFound):
        experiment_start(experiment=unknown)
    with pytest.raises(ApplicationError) as error:
        experiment_start(experiment=held)
    assert error.value.code == "experiment_not_queued"
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_train_success_chains_the_evaluation_and_its_success_scores_the_experiment(
    theta0, benchmark, data_entry, tmp_path
):
    run = make_run(base_checkpoint=theta0, benchmark=benchmark)
    entry = data_entry(rows=50)
    experiment = new_experiment(run, action={"data": [entry.handle], "hyperparameters": {**FAST_RECIPE, "seed": 4}})

    train = experiment_start(experiment=experiment)
    assert experiment_start(experiment=experiment) == train  # idempotent
    assert (train.kind, train.seed, train.spec["data"][0]["sha256"]) == (JobKind.TRAIN, 4, entry.sha256)
    assert DataUsage.objects.filter(entry=entry, experiment=experiment, purpose="train").exists()
    train = services.job_claim(job_id=train.pk, worker="w:1")
    assert Experiment.objects.get(pk=experiment.pk).status == ExperimentStatus.RUNNING

    # The worker's output: any checkpoint folder; the service stores and registers it.
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"weights")
    services.job_succeed_with_checkpoint(job=train, checkpoint_dir=out, parent=theta0, result={"steps": 30})

    experiment.refresh_from_db()
    output = Checkpoint.objects.get(producing_job=train)
    assert experiment.output_checkpoint == output
    assert output.parent == theta0
    evaluate = Job.objects.get(experiment=experiment, kind=JobKind.EVALUATE)
    assert evaluate.spec["checkpoint"] == str(output.uuid)
    assert evaluate.spec["benchmark"] == str(benchmark.uuid)
    assert evaluate.spec["split"] == "feedback"
    assert experiment.status == ExperimentStatus.RUNNING

    evaluate = services.job_claim(job_id=evaluate.pk, worker="w:2")
    ids = benchmark.sample_ids["feedback"]
    rows = [{"id": sid, "output": "7", "correct": i % 4 == 0} for i, sid in enumerate(ids)]
    seal = {"evaluator_sha256": benchmark.evaluator_sha256, "settings_sha256": benchmark.settings_sha256,
            "data_sha256": benchmark.data_sha256["feedback"]}  # fmt: skip
    services.job_succeed_with_evaluation(
        job=evaluate, checkpoint=output, benchmark=benchmark, split="feedback", rows=rows, backend="hf", seal=seal
    )

    experiment.refresh_from_db()
    evaluation = Evaluation.objects.get(job=evaluate)
    assert (evaluation.correct, evaluation.sample_count) == (25, 100)
    assert experiment.feedback_score == evaluation.score == 0.25
    assert experiment.status == ExperimentStatus.SUCCEEDED
    assert experiment_events(experiment) == ["running", "succeeded"]


@pytest.mark.django_db
def test_a_lost_attempt_keeps_the_experiment_running_until_attempts_run_out(theta0, benchmark, data_entry):
    run = make_run(base_checkpoint=theta0, benchmark=benchmark)
    experiment = new_experiment(run, action={"data": [data_entry(rows=50).handle], "hyperparameters": FAST_RECIPE})
    first = services.job_claim(job_id=experiment_start(experiment=experiment).pk, worker="w:1")
    Job.objects.filter(pk=first.pk).update(heartbeat_at="2000-01-01T00:00:00Z")

    services.jobs_reap_stale(stale_after_seconds=10, max_attempts=2)

    assert Experiment.objects.get(pk=experiment.pk).status == ExperimentStatus.RUNNING
    second = services.job_claim(job_id=Job.objects.get(previous_attempt=first).pk, worker="w:2")
    Job.objects.filter(pk=second.pk).update(heartbeat_at="2000-01-01T00:00:00Z")

    services.jobs_reap_stale(stale_after_seconds=10, max_attempts=2)

    assert Experiment.objects.get(pk=experiment.pk).status == ExperimentStatus.FAILED
    assert not Job.objects.filter(previous_attempt=second).exists()


# --- on a real worker ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_train_eval_experiment_runs_end_to_end_on_a_worker(celery_worker, theta0, benchmark, data_entry, settings):
    run = make_run(base_checkpoint=theta0, benchmark=benchmark)
    experiment = new_experiment(run, action={"data": [data_entry().handle], "hyperparameters": FAST_RECIPE})
    worker = celery_worker()

    experiment_start(experiment=experiment)

    def ended() -> Experiment | None:
        current = Experiment.objects.get(pk=experiment.pk)
        return current if current.status not in ("queued", "running") else None

    done = wait_for(ended, timeout=420, what="the experiment to end", logs=worker.log)
    assert done.status == ExperimentStatus.SUCCEEDED, list(Job.objects.values_list("kind", "status", "error"))
    train, evaluate = Job.objects.filter(experiment=done).order_by("pk")
    assert (train.kind, evaluate.kind) == (JobKind.TRAIN, JobKind.EVALUATE)
    assert [train.status, evaluate.status] == [JobStatus.SUCCEEDED, JobStatus.SUCCEEDED]

    # Training: exactly one checkpoint, safetensors and tokenizer, manifest true to the files.
    checkpoint = Checkpoint.objects.get(producing_job=train)
    assert done.output_checkpoint == checkpoint
    assert checkpoint.parent == theta0
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(checkpoint.manifest)
    assert not [name for name in checkpoint.manifest if name.endswith((".bin", ".pt", ".pkl", ".pth"))]
    assert sha256_tree(checkpoint_local_dir(checkpoint=checkpoint)) == checkpoint.manifest
    assert list(Checkpoint.objects.filter(run=run)) == [checkpoint]
    assert not (Path(settings.DATA_DIR) / "work" / "checkpoints" / str(train.uuid)).exists()
    assert train.result["steps"] == FAST_RECIPE["max_steps"]
    # The loss curve and throughput streamed into the row while it ran.
    losses = [(p["step"], p["loss"]) for p in train.metrics["points"] if "loss" in p]
    assert [step for step, _ in losses] == [10, 20, 30]
    assert all(math.isfinite(loss) for _, loss in losses)
    assert train.metrics["last"]["tokens_per_second"] > 0
    assert JobLogLine.objects.filter(job=train, text__startswith="step ").count() >= 3
    # Reproducibility: the executing worker's versions and commit, and the seed.
    assert train.versions["executed"]["packages"]["trl"]
    assert train.versions["executed"]["code"]["commit"]
    assert train.seed == 0
    # Accelerator time of both jobs is charged to the run.
    assert Run.objects.get(pk=run.pk).used_accelerator_seconds == pytest.approx(
        train.resource_seconds + evaluate.resource_seconds
    )

    # Evaluation of θ_out on the sealed feedback split.
    evaluation = Evaluation.objects.get(job=evaluate)
    assert (evaluation.checkpoint, evaluation.split, evaluation.status) == (done.output_checkpoint, "feedback", "ok")
    assert done.feedback_score == evaluation.score
    # Every sealed feedback sample was scored once, under the hashes registered for it.
    sample_ids = list(EvaluationSample.objects.filter(evaluation=evaluation).values_list("sample_id", flat=True))
    assert sorted(sample_ids) == sorted(benchmark.sample_ids["feedback"])
    assert evaluation.correct == EvaluationSample.objects.filter(evaluation=evaluation, correct=True).count()
    assert (evaluation.evaluator_sha256, evaluation.settings_sha256, evaluation.data_sha256) == (
        benchmark.evaluator_sha256, benchmark.settings_sha256, benchmark.data_sha256["feedback"],
    )  # fmt: skip
    # The record names what generated: the engine, and the torch and transformers that ran it.
    assert evaluation.backend == evaluation.inference["engine"] == "hf"
    assert evaluation.inference["versions"] == {"torch": torch.__version__, "transformers": transformers.__version__}
    # The context rule both engines apply (apps.ml.context), with the tiny model's context; no prompt near it.
    assert evaluation.inference["context"] == {"rule": "cap-max-tokens", "length": 512, "capped": 0, "over_context": 0}
    assert experiment_events(done) == ["running", "succeeded"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_tampered_sealed_file_makes_the_next_evaluation_refuse(celery_worker, theta0, benchmark):
    run = make_run(base_checkpoint=theta0, benchmark=benchmark)
    worker = celery_worker()

    def evaluate_theta0() -> Job:
        experiment = new_experiment(run, kind="eval_only")
        job = experiment_start(experiment=experiment)
        return wait_for(
            lambda: (j := Job.objects.get(pk=job.pk)).status in (JobStatus.SUCCEEDED, JobStatus.FAILED) and j,
            timeout=240, what="the evaluation job to end", logs=worker.log,
        )  # fmt: skip

    before = evaluate_theta0()
    assert before.status == JobStatus.SUCCEEDED, before.error
    assert Evaluation.objects.get(job=before).status == EvaluationStatus.OK

    # Change one answer in the sealed feedback split, as someone with file access might.
    sealed = Path(benchmark.sealed_path) / "feedback.jsonl"
    rows = [json.loads(line) for line in sealed.read_text(encoding="utf-8").splitlines()]
    rows[0]["answer"] = str(int(rows[0]["answer"]) + 1)
    os.chmod(sealed, 0o644)
    sealed.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    after = evaluate_theta0()

    assert after.status == JobStatus.FAILED
    assert "evaluation refused" in after.error
    refused = Evaluation.objects.get(job=after)
    assert refused.status == EvaluationStatus.REFUSED
    assert "feedback.jsonl changed" in refused.refusal_reason
    assert refused.score is None
    assert not EvaluationSample.objects.filter(evaluation=refused).exists()
    assert Experiment.objects.get(pk=after.experiment_id).status == ExperimentStatus.FAILED
    # The refusing evaluation records the broken seal; the failed experiment's integrity checks,
    # which re-verify the benchmark on the default queue, may record it again.
    first_seal_event = Event.objects.filter(type="benchmark.seal_broken").order_by("id").first()
    assert first_seal_event is not None
    assert "feedback.jsonl" in first_seal_event.arguments["reason"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_evaluation_job_scores_with_the_sealed_evaluator_copy(
    celery_worker, theta0, minibench_dir, tmp_path, monkeypatch
):
    # Registered when evaluators.py held an inverted exact_match; the worker imports today's file.
    then = tmp_path / "evaluators_then.py"
    then.write_text(
        Path(evaluators.__file__).read_text()
        + "\n\n_today = exact_match\nEVALUATORS['exact_match'] = lambda output, answer: not _today(output, answer)\n"
    )
    with monkeypatch.context() as registering_then:
        registering_then.setattr(evaluators, "__file__", str(then))
        benchmark = benchmark_register(
            name="minibench/arithmetic-then", task_dir=minibench_dir / "tasks" / "arithmetic"
        )
    run = make_run(base_checkpoint=theta0, benchmark=benchmark)
    worker = celery_worker()

    job = experiment_start(experiment=new_experiment(run, kind="eval_only"))
    done = wait_for(
        lambda: (j := Job.objects.get(pk=job.pk)).status in (JobStatus.SUCCEEDED, JobStatus.FAILED) and j,
        timeout=240, what="the evaluation job to end", logs=worker.log,
    )  # fmt: skip

    assert done.status == JobStatus.SUCCEEDED, done.error
    evaluation = Evaluation.objects.get(job=done)
    answers = {
        row["id"]: row["answer"]
        for row in map(json.loads, (Path(benchmark.sealed_path) / "feedback.jsonl").read_text().splitlines())
    }
    samples = list(EvaluationSample.objects.filter(evaluation=evaluation))
    assert len(samples) == len(answers)
    # Every verdict is the sealed (inverted) one: the opposite of what the live module says.
    for sample in samples:
        assert sample.correct is not evaluators.exact_match(sample.output, answers[sample.sample_id]), sample.output
    assert evaluation.score > 0.5  # θ0 is mostly wrong, so the inverted copy scores it mostly right
    assert (
        evaluation.evaluator_sha256
        == benchmark.evaluator_sha256
        != hashlib.sha256(Path(evaluators.__file__).read_bytes()).hexdigest()
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_final_split_is_not_evaluated_on_an_external_server_that_cannot_prove_its_weights(
    celery_worker, theta0, benchmark
):
    # Nothing listens on that port: the refusal must come before any request is made.
    worker = celery_worker(RSI_EVAL_ENGINE="vllm", RSI_VLLM_URL="http://127.0.0.1:9/")
    run = make_run(base_checkpoint=theta0, benchmark=benchmark)
    spec = {**evaluation_spec(checkpoint=theta0, benchmark=benchmark, split="final"), "roles": ["theta0"]}
    job = services.job_enqueue(kind=JobKind.FINAL_EVAL, spec=spec, run=run)

    done = wait_for(
        lambda: (j := Job.objects.get(pk=job.pk)).status in (JobStatus.SUCCEEDED, JobStatus.FAILED) and j,
        timeout=240, what="the final evaluation job to end", logs=worker.log,
    )  # fmt: skip

    assert done.status == JobStatus.FAILED
    refused = Evaluation.objects.get(job=done)
    assert (refused.status, refused.split, refused.score) == (EvaluationStatus.REFUSED, "final", None)
    assert "http://127.0.0.1:9" in refused.refusal_reason
    assert "RSI_VLLM_TRUSTED=1" in refused.refusal_reason
    assert not EvaluationSample.objects.filter(evaluation=refused).exists()
    assert "evaluation refused" in done.error
