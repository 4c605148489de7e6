"""Accelerator job tasks (queue ``gpu``): training and sealed evaluation.

Each task gets a job id only, claims the row, keeps it alive with a heartbeat thread while it
calls the Django-free core in `apps.ml` (`training.train`, `inference.evaluate`), and records the
outcome through a service. They are
acks_late and reject_on_worker_lost: safe because the claim makes a redelivered message a no-op,
and a worker that dies mid-job is noticed by the reaper, which queues attempt N+1.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import SealBroken, benchmark_load_sealed, benchmark_scorer
from apps.core.errors import Conflict
from apps.core.queues import TaskName
from apps.dojo.models import EnvironmentBuild
from apps.dojo.services import environment_build_execute, environment_build_fail
from apps.experiments.models import Checkpoint
from apps.experiments.selectors import checkpoint_registered_profile
from apps.jobs.models import Job
from apps.jobs.services import (
    checkpoint_dir_for,
    job_refuse_evaluation,
    job_succeed,
    job_succeed_with_checkpoint,
    job_succeed_with_evaluation,
)
from apps.ml.agent_sft_config import agent_sft_config
from apps.ml.context import CONTEXT_RULE, model_context
from apps.ml.hparams import validate_train_config
from workers.runtime import (
    JobTask,
    RunningJob,
    checkpoint_verified_dir,
    data_verified_file,
    job_start,
    job_task,
)

logger = logging.getLogger(__name__)

# Celery's soft limits of the job tasks (the backstop: see workers.runtime.job_task).
TRAIN_SOFT_LIMIT_SECONDS = 6 * 3600
EVAL_SOFT_LIMIT_SECONDS = 2 * 3600


@job_task(TaskName.TRAIN_JOB, soft_time_limit=TRAIN_SOFT_LIMIT_SECONDS)
def train_job_task(self: JobTask, *, job_id: int, passes: int = 0) -> None:
    """Train θ_in on datapool files with a validated recipe; register exactly one output checkpoint."""
    job = job_start(job_id=job_id, passes=passes)
    if job is None:
        return

    def run(base_dir: Path, data_files: list[Path], out_dir: Path, hooks: Any, log: Any) -> Any:
        from apps.ml.launch import launch_train  # noqa: PLC0415 - torch/TRL take seconds; beat first

        # The job's seed wins, so "the seed recorded on the job" is the seed that trained.
        config = validate_train_config({**job.spec["hyperparameters"], "seed": job.seed})
        on = f" on {job.accelerators} devices" if job.accelerators > 1 else ""
        log(f"training {config.recipe}/{config.adapter} for {config.max_steps} steps{on}")
        # One device: in this process, as always; more: Accelerate's launcher (apps.ml.launch).
        return launch_train(
            config,
            base_dir=base_dir,
            data_files=data_files,
            out_dir=out_dir,
            hooks=hooks,
            devices=job.accelerators,
            strategy=job.spec.get("strategy", "ddp"),
            visible_devices=job.devices or None,
        )

    _train_and_register(job, parent_uuid=job.spec["input_checkpoint"], run=run)


def _train_and_register(job: Job, *, parent_uuid: str, run: Callable[..., Any]) -> None:
    """The body every training job shares: verified inputs, heartbeat, cancel, one registered output.

    ``run(base_dir, data_files, out_dir, hooks, log)`` trains and returns a TrainResult.
    """
    out_dir = checkpoint_dir_for(job)
    # Beating from the claim on: importing torch/TRL alone takes seconds.
    with RunningJob(job) as running:
        from apps.ml.launch import Cancelled, TrainHooks  # noqa: PLC0415 - torch/TRL take seconds; beat first

        parent = Checkpoint.objects.get(uuid=parent_uuid)
        base_dir = checkpoint_verified_dir(parent)
        data_files = [data_verified_file(item) for item in job.spec["data"]]
        running.log(f"from {parent.handle} on {[item.get('handle', item['uri']) for item in job.spec['data']]}")
        hooks = TrainHooks(on_log=running.on_log, should_stop=running.should_stop, on_progress=running.on_progress)
        try:
            result = run(base_dir, data_files, out_dir, hooks, running.log)
        except Cancelled:
            running.finish_stopped()
            return
        outcome = {
            "steps": result.steps,
            "final_loss": result.final_loss,
            "tokens_per_second": result.tokens_per_second,
            "train_seconds": result.seconds,
        }
        try:
            # Stored under its manifest digest and registered (a short database outage is waited
            # out); the scratch copy goes either way.
            running.record(
                lambda: job_succeed_with_checkpoint(job=job, checkpoint_dir=out_dir, parent=parent, result=outcome)
            )
        except Conflict:
            # Reaped while training: attempt N+1 owns the job now, so this output never counts.
            logger.warning("job %s was reaped during training; its checkpoint is not registered", job.uuid)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)


@job_task(TaskName.EVALUATE_JOB, soft_time_limit=EVAL_SOFT_LIMIT_SECONDS)
def evaluate_job_task(self: JobTask, *, job_id: int, passes: int = 0) -> None:
    """Evaluate a checkpoint on a sealed split with the benchmark's own settings; refuse if the seal broke."""
    job = job_start(job_id=job_id, passes=passes)
    if job is None:
        return
    spec = job.spec
    checkpoint = Checkpoint.objects.get(uuid=spec["checkpoint"])
    benchmark = Benchmark.objects.get(uuid=spec["benchmark"])
    split = spec["split"]
    with RunningJob(job) as running:
        try:
            # Verifies evaluator, settings and data hashes before anything is run.
            samples, task_settings = benchmark_load_sealed(benchmark=benchmark, split=split)
            score = benchmark_scorer(benchmark=benchmark)
        except SealBroken as exc:
            job_refuse_evaluation(job=job, checkpoint=checkpoint, benchmark=benchmark, split=split, reason=exc.reason)
            return
        checkpoint_dir = checkpoint_verified_dir(checkpoint)
        from apps.experiments.final_eval import seeds_aggregate  # noqa: PLC0415 - numpy; beat first
        from apps.ml.engines import VLLMServer, choose_engine  # noqa: PLC0415
        from apps.ml.inference import evaluate_seeds  # noqa: PLC0415 - torch takes seconds; beat first
        from apps.ml.seeds import run_seeds  # noqa: PLC0415

        # The engine is the worker host's configuration (RSI_EVAL_ENGINE, RSI_VLLM_*) unless
        # the job names one; the seeds are the final evaluation's (1 for greedy decoding).
        choice = choose_engine(requested=spec.get("backend"))
        engine = choice.engine
        if split == "final" and choice.provenance == "unknown":
            # The final split decides the run's result: a score from weights nobody can name is
            # not run at all (feedback evaluations on such a server run, and their experiments'
            # integrity checks fail closed).
            reason = (
                f"the final split is not evaluated on an external vLLM server ({choice.url}) that cannot prove "
                "its weights; set RSI_VLLM_TRUSTED=1 for a server you vouch for, or unset RSI_VLLM_URL so the "
                "worker starts its own"
            )
            job_refuse_evaluation(job=job, checkpoint=checkpoint, benchmark=benchmark, split=split, reason=reason)
            return
        # One path for both adapters: the same engine choice, seeds, retry cascade and aggregate.
        # The contract's decoding is the verified one (its keys are explicit); the seeds are the
        # final evaluation's, 1 for greedy decoding.
        adapter = str(benchmark.contract.get("adapter") or "builtin")
        decoding = benchmark.contract.get("decoding") or task_settings.get("decoding", {})
        seeds = run_seeds(decoding, spec.get("seeds")) if split == "final" else [0]
        running.log(
            f"evaluating {checkpoint.handle} on {benchmark.name} {split} ({len(samples)} samples, "
            f"{choice.engine}{' under Inspect' if adapter == 'inspect' else ''}, seeds {seeds})"
        )
        inference: dict[str, object] = {"engine": choice.engine, "weight_provenance": choice.provenance}
        if adapter == "inspect":
            inference["adapter"] = "inspect"
        # What generated: this worker's torch and transformers for HF generate, the vLLM
        # environment (named by the hash of its pins, envs/vllm.txt) for a managed server; the
        # Inspect packages are the contract's, verified by the runner.
        if choice.engine == "hf":
            inference["versions"] = {name: package_version(name) for name in ("torch", "transformers")}
        elif choice.engine == "vllm":
            inference["environment"] = Path(str(choice.python)).parents[1].name
        # The registered model's EOS handling (its family's end-of-turn tokens, every EOS id its
        # generation_config listed) ends generations on every engine, as PostTrainBench pins it.
        profile = checkpoint_registered_profile(checkpoint)
        # One rule at the context limit for every engine (apps.ml.context), recorded with the evaluation.
        context = model_context(checkpoint_dir)
        context_record: dict[str, object] = {"rule": CONTEXT_RULE, "length": context}
        inference["context"] = context_record

        def evaluate_all(url: str | None, served_dir: Path | None) -> list[dict[str, Any]]:
            """Every seed on the engine at ``url`` (None: HF generate in this process)."""
            if adapter != "inspect":
                return evaluate_seeds(
                    seeds=seeds, backend=engine, vllm_url=url, served_dir=served_dir,
                    checkpoint_dir=checkpoint_dir, samples=samples, task={**task_settings, "decoding": decoding},
                    batch_size=int(spec.get("batch_size", 32)), model_profile=profile,
                    # The benchmark's sealed, hash-verified evaluator decides: the code that was
                    # registered, not whatever evaluators.py the worker happens to import.
                    scorer=score,
                )  # fmt: skip
            # Out of process, in the Inspect env; the engine answers it on a loopback endpoint.
            from apps.benchmarks.adapters import (  # noqa: PLC0415
                chat_renderer,
                context_limiter,
                hf_generate,
                inspect_evaluate_seeds,
                registered_stop_ids,
                vllm_generate,
            )

            if url is None:
                generate, chat_template = hf_generate(checkpoint_dir, decoding, profile)
            else:
                stop_ids = registered_stop_ids(checkpoint_dir, profile)
                generate = vllm_generate(
                    url, served_dir or checkpoint_dir, decoding, stop_ids, allowed=context_limiter(checkpoint_dir)
                )
                chat_template = chat_renderer(checkpoint_dir)
            return inspect_evaluate_seeds(
                seeds=seeds, contract=benchmark.contract, sealed_path=Path(benchmark.sealed_path), samples=samples,
                model_id=checkpoint.manifest_sha256, generate=generate, chat_template=chat_template, scorer=score,
                log_dir=Path(settings.DATA_DIR) / "inspect-logs" / str(job.uuid),
            )  # fmt: skip

        from apps.benchmarks.adapters import HarnessRefused  # noqa: PLC0415

        try:
            if choice.engine == "vllm":
                server_python = str(choice.python)  # choose_engine names the vLLM environment's python
                with VLLMServer(
                    checkpoint_dir=checkpoint_dir, manifest=checkpoint.manifest, python=server_python,
                    max_model_len=context,  # the limit the context rule applied (apps.ml.context)
                ) as server:  # fmt: skip
                    running.log(f"vllm serve answered after {server.startup_seconds:.0f} s")
                    results = evaluate_all(server.url, server.model_dir)
                    server.verify()  # the files it served are still the manifest's
                inference["startup_seconds"] = round(server.startup_seconds, 1)
            else:
                results = evaluate_all(choice.url, None)
                if choice.url:
                    inference["server"] = choice.url
        except HarnessRefused as exc:
            job_refuse_evaluation(job=job, checkpoint=checkpoint, benchmark=benchmark, split=split, reason=exc.reason)
            return
        aggregate = seeds_aggregate(results)
        inference["seeds"] = aggregate
        # Per-sample rows: the first seed that succeeded (sealed; Reviewers compare them by id).
        rows = next(r["rows"] for r in results if r["status"] == "ok")
        context_record |= {
            "capped": sum("max_tokens" in r for r in rows),
            "over_context": sum(bool(r.get("over_context")) for r in rows),
        }
        if running.should_stop():
            running.finish_stopped()
            return
        try:
            running.record(
                lambda: job_succeed_with_evaluation(
                    job=job,
                    checkpoint=checkpoint,
                    benchmark=benchmark,
                    split=split,
                    rows=rows,
                    backend=engine,
                    seal=task_settings["seal"],
                    inference=inference,
                )
            )
        except Conflict:
            logger.warning("job %s ended elsewhere during evaluation; result not recorded", job.uuid)


@job_task(TaskName.DOJO_BUILD_JOB, soft_time_limit=EVAL_SOFT_LIMIT_SECONDS)
def dojo_build_job_task(self: JobTask, *, job_id: int, passes: int = 0) -> None:
    """Build RSI-Dojo task environments: every RSI-Craft step on every task, each decision recorded."""
    job = job_start(job_id=job_id, passes=passes)
    if job is None:
        return
    build = EnvironmentBuild.objects.get(uuid=job.spec["build"])
    with RunningJob(job) as running:
        try:
            # Idempotent per task: a redelivered job resumes after the tasks already recorded.
            environment_build_execute(build=build, log=running.log, should_stop=running.should_stop)
        except Exception as exc:
            # The build row says why too (the job's failure handler records the traceback); re-raised.
            environment_build_fail(build=build, error=f"{type(exc).__name__}: {exc}")
            raise
        if running.should_stop():
            running.finish_stopped()
            return
        try:
            running.record(lambda: job_succeed(job=job, result={"build": str(build.uuid), **build.summary}))
        except Conflict:
            logger.warning("job %s ended elsewhere during the build; result not recorded", job.uuid)


@job_task(TaskName.AGENT_SFT_JOB, soft_time_limit=TRAIN_SOFT_LIMIT_SECONDS)
def agent_sft_job_task(self: JobTask, *, job_id: int, passes: int = 0) -> None:
    """Fine-tune a chat checkpoint on trajectory datasets; register the output with its base as parent.

    The producing job's spec names the datasets (uuid and sha256): the checkpoint's lineage to
    its trajectories.
    """
    job = job_start(job_id=job_id, passes=passes)
    if job is None:
        return

    def run(base_dir: Path, data_files: list[Path], out_dir: Path, hooks: Any, log: Any) -> Any:
        from apps.ml.agent_sft import agent_sft_train  # noqa: PLC0415 - TRL takes seconds

        config = agent_sft_config({**job.spec["hyperparameters"], "seed": job.seed})
        log(f"agent_sft: {config.epochs} epochs, lr {config.learning_rate:g} to {config.min_learning_rate:g}")
        return agent_sft_train(config, base_dir=base_dir, data_files=data_files, out_dir=out_dir, hooks=hooks)

    _train_and_register(job, parent_uuid=job.spec["base_checkpoint"], run=run)
