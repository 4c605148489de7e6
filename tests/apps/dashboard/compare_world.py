"""Two finished runs to compare, built through the real services plus the rows a finished run leaves.

    "full, seed 0"          policy reviewers on,  2 parallel; accepted feedback 0.30 (+5 min), 0.45 (+12 min)
    "no reviewer, seed 1"   policy reviewers off, 3 parallel; accepted feedback 0.50 (+8 min)

Each returned a checkpoint whose final-split evaluation has per-sample rows (EvaluationSample):
run A on ids x0..x39, correct on x0..x19 (0.500); run B on ids x4..x43, correct on x4..x33 (0.750).
They share x4..x39 (36 ids): there A is right on 16, B on 30, so B − A = 14/36 = 0.389.
Evaluations and their jobs, like tests/apps/dashboard/world.py's, are written directly: the rows the GPU
evaluation service would leave (it needs a real checkpoint on disk).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.utils import timezone

from apps.core.hashing import sha256_text
from apps.experiments.models import Evaluation, EvaluationSample, Experiment
from apps.experiments.services import experiment_create, experiment_set_integrity
from apps.jobs.models import Job
from apps.research.choices import NodeKind, RunStatus
from apps.research.models import Run
from apps.research.services import decision_record, node_create, run_set_status
from tests.factories import BenchmarkFactory, CheckpointFactory, make_run

SHARED = 36
DIFFERENCE = 14 / 36


@dataclass
class Pair:
    a: Run
    b: Run


def _evaluation(run: Run, *, checkpoint, split: str, ids: list[str], correct: set[str], experiment=None, at=None):
    n, right = len(ids), sum(1 for i in ids if i in correct)
    # Evaluations are append-only: when one was made is its job's end.
    job = None if at is None else Job.objects.create(
        run=run, experiment=experiment, kind="evaluate", queue="gpu", status="succeeded", worker="gpu@host-a",
        progress=1.0, started_at=at - dt.timedelta(minutes=1), finished_at=at, resource_seconds=60,
    )  # fmt: skip
    evaluation = Evaluation.objects.create(
        run=run, experiment=experiment, checkpoint=checkpoint, benchmark=run.benchmark, split=split, job=job,
        score=right / n, correct=right, sample_count=n, evaluator_sha256=sha256_text("evaluator"),
        settings_sha256=sha256_text("settings"), data_sha256=sha256_text(f"data-{split}"),
    )  # fmt: skip
    EvaluationSample.objects.bulk_create(
        EvaluationSample(evaluation=evaluation, sample_id=i, output="42" if i in correct else "0", correct=i in correct)
        for i in ids
    )
    return evaluation


def _finished_run(*, name: str, benchmark, base, policy: dict, parallel: int, feedback: list[tuple[int, float]],
                  final_ids: list[str], final_correct: set[str]) -> Run:  # fmt: skip
    run = make_run(name=name, benchmark=benchmark, base_checkpoint=base, policy=policy, max_parallel_workers=parallel)
    run = run_set_status(run=run, status=RunStatus.RUNNING, actor="test")
    started = timezone.now() - dt.timedelta(minutes=30)
    decision = decision_record(run=run, kind="branch", trigger="run_start", rationale="one SFT bet")
    worker = node_create(run=run, kind=NodeKind.WORKER, task="SFT on clean arithmetic", decision=decision)
    checkpoint = None
    for minutes, score in feedback:
        checkpoint = CheckpointFactory(parent=base, run=run)
        experiment = experiment_create(
            run=run, owner=worker, kind="train_eval", input_checkpoint=base, action={"recipe": "sft"}
        )
        Experiment.objects.filter(pk=experiment.pk).update(
            status="succeeded", feedback_score=score, output_checkpoint=checkpoint
        )
        ids = [f"f{i}" for i in range(20)]
        _evaluation(run, checkpoint=checkpoint, split="feedback", ids=ids, correct=set(ids[: round(score * 20)]),
                    experiment=experiment, at=started + dt.timedelta(minutes=minutes))  # fmt: skip
        experiment_set_integrity(experiment=experiment, status="accepted", actor="auto", reason="clean")
    _evaluation(run, checkpoint=checkpoint, split="final", ids=final_ids, correct=final_correct)
    Run.objects.filter(pk=run.pk).update(
        started_at=started, finished_at=started + dt.timedelta(minutes=25), result_checkpoint=checkpoint
    )
    run_set_status(run=run, status=RunStatus.FINISHED, actor="test", reason="final evaluation done")
    return Run.objects.get(pk=run.pk)


def build_pair() -> Pair:
    benchmark = BenchmarkFactory(name="test/arithmetic")
    base = CheckpointFactory(is_base=True)
    a = _finished_run(
        name="full, seed 0", benchmark=benchmark, base=base, policy={"reviewers": True, "seed": 0}, parallel=2,
        feedback=[(5, 0.30), (12, 0.45)], final_ids=[f"x{i}" for i in range(40)],
        final_correct={f"x{i}" for i in range(20)},
    )  # fmt: skip
    b = _finished_run(
        name="no reviewer, seed 1", benchmark=benchmark, base=base, policy={"reviewers": False, "seed": 1},
        parallel=3, feedback=[(8, 0.50)], final_ids=[f"x{i}" for i in range(4, 44)],
        final_correct={f"x{i}" for i in range(4, 34)},
    )  # fmt: skip
    return Pair(a=a, b=b)
