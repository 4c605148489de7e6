"""Runs for the workbench tests (issue 36, items 1-3), made only through the services a real run uses.

    "sweep low lr"   finished; exp_0001 sft lr 1e-4 × 50 steps (feedback 12/20 = 0.60),
                     exp_0002 sft lr 3e-4 × 80 steps (feedback 10/20 = 0.50); returns exp_0001,
                     final 14/20 = 0.70, θ0 5/20 = 0.25, reference 17/20 = 0.85: gain 0.75
    "sweep high lr"  finished; exp_0001 sft lr 2e-3 × 50 steps (feedback 9/20 = 0.45);
                     final 8/20 = 0.40: gain 0.25
    "still running"  running, nothing trained yet

Each experiment goes through the pipeline: experiment_create, experiment_start (train job, data
usage), job_claim, job_report (training metrics and log lines), job_succeed_with_checkpoint (real
files in the artifact store), the evaluation the pipeline enqueues, job_succeed_with_evaluation,
experiment_set_integrity; each finished run through run_stop_request, run_final_eval_start, its
final-evaluation jobs and run_finish. ``settings.ARTIFACT_ROOT`` must point at a temporary folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from apps.core.hashing import sha256_text
from apps.datapool.models import DataEntry
from apps.datapool.services import data_register_from_workspace
from apps.experiments.models import Checkpoint, Experiment
from apps.experiments.services import experiment_create, experiment_set_integrity
from apps.flows.pipeline import experiment_start
from apps.flows.runs import run_final_eval_start, run_finish, run_stop_request
from apps.jobs.choices import JobKind
from apps.jobs.models import Job
from apps.jobs.services import job_claim, job_report, job_succeed_with_checkpoint, job_succeed_with_evaluation
from apps.research.choices import NodeKind, RunStatus
from apps.research.models import Run
from apps.research.services import decision_record, node_create, run_set_status
from tests.factories import BenchmarkFactory, CheckpointFactory, make_run

SEAL = {key: sha256_text(key) for key in ("evaluator_sha256", "settings_sha256", "data_sha256")}
WORKER = "gpu@workbench"


@dataclass
class Workbench:
    low: Run
    high: Run
    running: Run
    entry: DataEntry
    experiments: dict[str, Experiment]  # "low/exp_0001", ...


def _rows(right: int, n: int = 20) -> list[dict[str, object]]:
    return [{"id": f"x{i:03d}", "output": str(i), "correct": i < right} for i in range(n)]


def _trained(run: Run, *, worker, entry: DataEntry, lr: float, steps: int, feedback: int, tmp: Path) -> Experiment:
    action = {"recipe": "sft", "data": [entry.handle], "hyperparameters": {"learning_rate": lr, "max_steps": steps}}
    experiment = experiment_create(run=run, owner=worker, kind="train_eval", input_checkpoint=run.base_checkpoint,
                                   action=action, claim=f"sft at lr {lr}")  # fmt: skip
    train = job_claim(job_id=experiment_start(experiment=experiment).pk, worker=WORKER)
    for step in range(10, steps + 1, 10):
        loss = round(2.0 * (1 - lr * 1000 * step / (steps * 4)), 4)
        job_report(job=train, metrics_point={"step": step, "loss": loss, "elapsed_s": step * 0.5},
                   log_line=f"step {step}: loss={loss}")  # fmt: skip
    folder = tmp / f"{run.pk}-{experiment.handle}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(f"weights of {run.name} {experiment.handle}".encode())
    (folder / "config.json").write_text(json.dumps({"lr": lr}), encoding="utf-8")
    job_succeed_with_checkpoint(job=train, checkpoint_dir=folder, parent=run.base_checkpoint, result={"steps": steps})
    evaluate = Job.objects.get(experiment=experiment, kind=JobKind.EVALUATE)
    evaluate = job_claim(job_id=evaluate.pk, worker=WORKER)
    experiment.refresh_from_db()
    job_succeed_with_evaluation(job=evaluate, checkpoint=experiment.output_checkpoint, benchmark=run.benchmark,
                                split="feedback", rows=_rows(feedback), backend="hf", seal=SEAL)  # fmt: skip
    return experiment_set_integrity(experiment=experiment, status="accepted", actor="auto", reason="clean")


def _finish(run: Run, *, best: int) -> Run:
    """Stop, run the final evaluations (θ0 5/20, reference 17/20, the best ``best``/20), finish."""
    correct = {"theta0": 5, "reference": 17}
    run = run_final_eval_start(run=run_stop_request(run=run, reason="test: end the run", actor="main"))
    for job in Job.objects.filter(run=run, kind=JobKind.FINAL_EVAL).order_by("pk"):
        claimed = job_claim(job_id=job.pk, worker=WORKER)
        role = next((r for r in job.spec["roles"] if r != "candidate"), "candidate")
        checkpoint = Checkpoint.objects.get(uuid=job.spec["checkpoint"])
        job_succeed_with_evaluation(job=claimed, checkpoint=checkpoint, benchmark=run.benchmark, split="final",
                                    rows=_rows(correct.get(role, best)), backend="hf", seal=SEAL)  # fmt: skip
    return run_finish(run=Run.objects.get(pk=run.pk))


def build_workbench(tmp: Path) -> Workbench:
    benchmark = BenchmarkFactory(name="test/workbench", reference_checkpoint=CheckpointFactory(is_reference=True))
    base = CheckpointFactory(is_base=True)
    workspace = tmp / "workspace"
    workspace.mkdir(parents=True)
    rows = [{"prompt": f"{i}+{i}=", "completion": str(2 * i)} for i in range(6)]
    (workspace / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    entry = None
    experiments: dict[str, Experiment] = {}
    runs: dict[str, Run] = {}
    for name, key, recipes, best in (
        ("sweep low lr", "low", [(1e-4, 50, 12), (3e-4, 80, 10)], 14),
        ("sweep high lr", "high", [(2e-3, 50, 9)], 8),
    ):
        run = make_run(name=name, benchmark=benchmark, base_checkpoint=base)
        run = run_set_status(run=run, status=RunStatus.RUNNING, actor="test")
        decision = decision_record(run=run, kind="branch", trigger="run_start", rationale="an lr sweep")
        worker = node_create(run=run, kind=NodeKind.WORKER, task="SFT at several learning rates", decision=decision)
        if entry is None:
            entry = data_register_from_workspace(workspace=workspace, path="sums.jsonl", name="sums", run=run)
        for lr, steps, feedback in recipes:
            experiment = _trained(run, worker=worker, entry=entry, lr=lr, steps=steps, feedback=feedback, tmp=tmp)
            experiments[f"{key}/{experiment.handle}"] = experiment
        runs[key] = _finish(run, best=best)
    running = run_set_status(run=make_run(name="still running", benchmark=benchmark, base_checkpoint=base),
                             status=RunStatus.RUNNING, actor="test")  # fmt: skip
    assert entry is not None
    return Workbench(low=runs["low"], high=runs["high"], running=running, entry=entry, experiments=experiments)
