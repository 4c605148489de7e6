"""Two finished runs to compare, built through the real services (tests.factories' factories over them).

    "full, seed 0"          policy reviewers on,  2 parallel; accepted feedback 0.30 (+5 min), 0.45 (+12 min)
    "no reviewer, seed 1"   policy reviewers off, 3 parallel; accepted feedback 0.50 (+8 min)

Each experiment trains on an uploaded data entry and is evaluated on the feedback split through
the pipeline and the job engine; each run then stops, its final-evaluation jobs run and it
finishes (run_final_eval_start picks the returned checkpoint: the best accepted feedback score).
The returned checkpoint's final-split evaluation has per-sample rows: run A on ids x0..x39,
correct on x0..x19 (0.500); run B on ids x4..x43, correct on x4..x33 (0.750). They share x4..x39
(36 ids): there A is right on 16, B on 30, so B − A = 14/36 = 0.389. θ0 is right on the first
``theta0_correct`` of each run's final ids (10 unless asked: 0.250).

The jobs take no time here, so each run's clock is set back after it finished: it started 25
minutes before its end, and each feedback evaluation's job ended the given minutes after the
start (the only fields written directly: timestamps no service takes as an argument).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from apps.core.hashing import sha256_text
from apps.experiments.services import experiment_create, experiment_set_integrity
from apps.jobs.models import Job
from apps.research.choices import NodeKind, RunStatus
from apps.research.models import Run
from apps.research.services import decision_record, node_create, run_set_status
from tests.factories import (
    BenchmarkFactory,
    CheckpointFactory,
    data_uploaded,
    experiment_trained,
    feedback_succeed,
    make_run,
    run_finished,
    scored_rows,
)

SHARED = 36
DIFFERENCE = 14 / 36
RUN_MINUTES = 25
FEEDBACK_IDS = [f"f{i}" for i in range(20)]


@dataclass
class Pair:
    a: Run
    b: Run


def _finished_run(*, name: str, benchmark, base, policy: dict, parallel: int, feedback: list[tuple[int, float]],
                  final_ids: list[str], final_correct: set[str], theta0_correct: int) -> Run:  # fmt: skip
    run = make_run(name=name, benchmark=benchmark, base_checkpoint=base, policy=policy, max_parallel_workers=parallel)
    run = run_set_status(run=run, status=RunStatus.RUNNING, actor="test")
    decision = decision_record(run=run, kind="branch", trigger="run_start", rationale="one SFT bet")
    worker = node_create(run=run, kind=NodeKind.WORKER, task="SFT on clean arithmetic", decision=decision)
    data = data_uploaded(node=worker, name="clean arithmetic")
    evaluated_at = {}
    for i, (minutes, score) in enumerate(feedback):
        experiment = experiment_create(
            run=run, owner=worker, kind="train_eval", input_checkpoint=base,
            action={"recipe": "sft", "data": [data.handle], "hyperparameters": {"max_steps": 10}},
        )  # fmt: skip
        experiment_trained(experiment, weights=sha256_text(f"{name} {i}"))
        evaluation = feedback_succeed(experiment, rows=scored_rows(FEEDBACK_IDS, round(score * len(FEEDBACK_IDS))))
        evaluated_at[evaluation.job_id] = minutes
        experiment_set_integrity(experiment=experiment, status="accepted", actor="auto", reason="clean")
    run = run_finished(
        run,
        final_rows={"best": scored_rows(final_ids, final_correct), "theta0": scored_rows(final_ids, theta0_correct)},
    )
    started = run.finished_at - dt.timedelta(minutes=RUN_MINUTES)
    Run.objects.filter(pk=run.pk).update(started_at=started)
    for job_id, minutes in evaluated_at.items():
        at = started + dt.timedelta(minutes=minutes)
        Job.objects.filter(pk=job_id).update(started_at=at - dt.timedelta(minutes=1), finished_at=at)
    return Run.objects.get(pk=run.pk)


def build_pair(*, theta0_correct: int = 10) -> Pair:
    benchmark = BenchmarkFactory(name="test/arithmetic")
    base = CheckpointFactory(is_base=True)
    a = _finished_run(
        name="full, seed 0", benchmark=benchmark, base=base, policy={"reviewers": True, "seed": 0}, parallel=2,
        feedback=[(5, 0.30), (12, 0.45)], final_ids=[f"x{i}" for i in range(40)],
        final_correct={f"x{i}" for i in range(20)}, theta0_correct=theta0_correct,
    )  # fmt: skip
    b = _finished_run(
        name="no reviewer, seed 1", benchmark=benchmark, base=base, policy={"reviewers": False, "seed": 1},
        parallel=3, feedback=[(8, 0.50)], final_ids=[f"x{i}" for i in range(4, 44)],
        final_correct={f"x{i}" for i in range(4, 34)}, theta0_correct=theta0_correct,
    )  # fmt: skip
    return Pair(a=a, b=b)
