"""A small, complete research run for the dashboard tests, built through the real services.

    decision d_start (branch, run_start)      -> worker_0001 "SFT on clean arithmetic", worker_0002 "DPO on pairs"
    decision d_verify (verify, worker_finalize, on worker_0001) -> reviewer_0001, scope {worker_0001}
    decision d_revise (revise, review_report, on worker_0001)   -> worker_0003, context from worker_0001;
                                                                  applied the operator's first guidance

    worker_0001: exp_0001 (train+eval, succeeded, accepted, 0.42) -> exp_0002 (flagged: executed test-set access, 0.61)
    worker_0002: exp_0003 (eval only, succeeded, pending: partial metric attribution, 0.35)
    worker_0003: exp_0004 (train, running; its job streams metrics and log lines)

Experiments start, train, are evaluated and succeed through the pipeline (flows.pipeline and the
job engine's services, as the workers drive them); evaluations are the job engine's records, usage
and guidance their services'. Rows without a public service of their own (the data entry, whose
registration reads files; the integrity findings, the checks' own output; the blocked attempt)
are written directly: they are the records those services would leave. The run's start time and
accelerator seconds are backdated (the jobs here take no time).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import Group, User
from django.utils import timezone

from apps.benchmarks.models import Benchmark
from apps.core.hashing import sha256_text
from apps.datapool.models import DataEntry
from apps.datapool.services import data_readme_append
from apps.experiments.events import event_append
from apps.experiments.models import Checkpoint, Evaluation, Experiment
from apps.experiments.services import experiment_create, experiment_set_integrity
from apps.flows.pipeline import experiment_start
from apps.integrity.choices import CATEGORIES, Adjudication, Observation
from apps.integrity.models import BlockedAttempt, FindingChange, IntegrityFinding
from apps.jobs.models import Job
from apps.jobs.services import job_claim, job_report
from apps.research.choices import NodeKind, RunStatus
from apps.research.models import Decision, Guidance, ResearchNode, Run
from apps.research.services import (
    decision_record,
    guidance_post,
    llm_usage_record,
    node_create,
    node_finalize,
    run_set_status,
)
from apps.reviews.models import ReviewReport
from apps.reviews.services import review_submit
from tests import factories
from tests.factories import (
    BenchmarkFactory,
    CheckpointFactory,
    evaluation_made,
    experiment_trained,
    job_evaluated,
    make_run,
    run_finished,
)

PASSWORD = "pw-dashboard-123"
ROLES = ("viewer", "operator", "admin")
SUBCATEGORIES = [sub for subs in CATEGORIES.values() for sub in subs]


def make_people() -> dict[str, User]:
    """One person per role, plus ``nobody`` (signed in, no role). Groups are created if missing:
    a transactional test database is flushed between tests and loses the migration's rows."""
    people = {}
    for role in ROLES:
        user = User.objects.create_user(f"{role}-person", password=PASSWORD)
        user.groups.add(Group.objects.get_or_create(name=role)[0])
        people[role] = user
    people["nobody"] = User.objects.create_user("nobody-person", password=PASSWORD)
    return people


@dataclass
class World:
    run: Run
    nodes: dict[str, ResearchNode]
    decisions: dict[str, Decision]
    exp: dict[str, Experiment]
    jobs: dict[str, Job]
    evals: dict[str, Evaluation]
    findings: dict[tuple[str, str], IntegrityFinding]
    report: ReviewReport
    guidance: dict[str, Guidance]
    data: DataEntry
    people: dict[str, User]
    extra: dict[str, Any] = field(default_factory=dict)


def _rows(correct: int, n: int) -> list[dict[str, Any]]:
    return [{"id": f"s{i:03d}", "output": str(i), "correct": i < correct} for i in range(n)]


def _evaluation(run: Run, *, checkpoint: Checkpoint, split: str, correct: int, n: int, experiment=None) -> Evaluation:
    """An evaluation job of the run (of ``experiment`` when given) run to its end."""
    return evaluation_made(run, checkpoint=checkpoint, split=split, rows=_rows(correct, n), experiment=experiment)


def feedback_succeed(experiment: Experiment, *, correct: int, n: int = 100, worker: str = "gpu@host-a") -> Evaluation:
    """The feedback evaluation the pipeline queued for ``experiment`` runs and succeeds (the experiment with it)."""
    return factories.feedback_succeed(experiment, rows=_rows(correct, n), worker=worker)


def _findings(experiment: Experiment, overrides: dict[str, tuple[str, str]]) -> dict[str, IntegrityFinding]:
    found = {}
    for sub in SUBCATEGORIES:
        observation, adjudication = overrides.get(sub, (Observation.NOT_FOUND_FULL, ""))
        finding = IntegrityFinding.objects.create(
            experiment=experiment, subcategory=sub, observation=observation, adjudication=adjudication,
            decided_by="auto" if not adjudication else "reviewer_0001",
            rationale="" if not adjudication else "training data contains sealed feedback items",
            evidence={} if observation != Observation.EXECUTED else {"sample_ids": ["f1"], "span": "12+30"},
        )  # fmt: skip
        FindingChange.objects.create(
            finding=finding, observation=observation, adjudication=adjudication, actor="auto", rationale="check ran"
        )
        found[sub] = finding
    return found


def build_world(*, people: dict[str, User] | None = None, benchmark: Benchmark | None = None) -> World:
    """``benchmark``: a registered one with its reference checkpoint (default: a factory row, no sealed data)."""
    people = people or make_people()
    if benchmark is None:
        benchmark = BenchmarkFactory(reference_checkpoint=CheckpointFactory(is_reference=True))
    reference = benchmark.reference_checkpoint
    run = make_run(name="arithmetic sprint", benchmark=benchmark, max_parallel_workers=4, reserved_final_seconds=600)
    run = run_set_status(run=run, status=RunStatus.RUNNING, actor="test")
    started = timezone.now() - dt.timedelta(minutes=30)
    Run.objects.filter(pk=run.pk).update(started_at=started, used_accelerator_seconds=900)
    run.refresh_from_db()
    base = run.base_checkpoint
    _evaluation(run, checkpoint=base, split="feedback", correct=6, n=20)
    _evaluation(run, checkpoint=base, split="final", correct=5, n=20)
    _evaluation(run, checkpoint=reference, split="feedback", correct=15, n=20)
    _evaluation(run, checkpoint=reference, split="final", correct=14, n=20)

    d_start = decision_record(run=run, kind="branch", trigger="run_start", rationale="two bets: SFT and DPO")
    w1 = node_create(run=run, kind=NodeKind.WORKER, task="SFT on clean arithmetic", decision=d_start)
    w2 = node_create(run=run, kind=NodeKind.WORKER, task="DPO on preference pairs", decision=d_start)

    data = DataEntry.objects.create(
        handle="data_0001", name="clean arithmetic", uri="file:///tmp/nowhere/data_0001.jsonl",
        sha256=sha256_text("clean arithmetic"), rows=200, size_bytes=12_345, format="sft",
        schema={"prompt": "string", "completion": "string"}, source_kind="catalog", source={"catalog": "arith-clean"},
        run=run, registered_by=w1,
    )  # fmt: skip
    data_readme_append(entry=data, author="worker_0001", text="Filtered the catalog copy for format.", node=w1)

    exp1 = experiment_create(
        run=run, owner=w1, kind="train_eval", input_checkpoint=base, claim="SFT lifts accuracy",
        action={"recipe": "sft", "data": ["data_0001"], "hyperparameters": {"learning_rate": 1e-4, "max_steps": 50}},
    )  # fmt: skip
    train, ckpt1 = experiment_trained(
        exp1, worker="gpu@host-a", points=[{"step": 1, "loss": 2.5}, {"step": 2, "loss": 1.9}], weights="b" * 64
    )
    e1 = feedback_succeed(exp1, correct=42)
    evaluate = Job.objects.get(pk=e1.job_id)
    e1_final = _evaluation(run, checkpoint=ckpt1, split="final", correct=40, n=100, experiment=exp1)
    experiment_set_integrity(
        experiment=Experiment.objects.get(pk=exp1.pk), status="accepted", actor="auto", reason="every subcategory clean"
    )

    exp2 = experiment_create(
        run=run, owner=w1, kind="train_eval", input_checkpoint=ckpt1, parents=[exp1],
        action={"recipe": "sft", "data": ["data_0001"], "hyperparameters": {"learning_rate": 5e-5, "max_steps": 80}},
    )  # fmt: skip
    _, ckpt2 = experiment_trained(
        exp2, worker="gpu@host-a", points=[{"step": 1, "loss": 1.8}, {"step": 2, "loss": 1.2}], weights="d" * 64
    )
    e2 = feedback_succeed(exp2, correct=61)
    experiment_set_integrity(
        experiment=Experiment.objects.get(pk=exp2.pk), status="flagged", actor="reviewer_0001",
        reason="sealed items in data",
    )  # fmt: skip

    exp3 = experiment_create(
        run=run, owner=w2, kind="eval_only", input_checkpoint=base, action={"evaluate": "feedback"}
    )
    e3 = job_evaluated(
        experiment_start(experiment=exp3), worker="gpu@host-b", checkpoint=base, split="feedback", rows=_rows(35, 100)
    )

    findings = {}
    for handle, experiment, overrides in (
        ("exp_0001", exp1, {}),
        ("exp_0002", exp2, {"test_set_access": (Observation.EXECUTED, Adjudication.EXPLICIT_VIOLATION)}),
        ("exp_0003", exp3, {"metric_attribution": (Observation.NOT_FOUND_PARTIAL, "")}),
    ):
        for sub, finding in _findings(experiment, overrides).items():
            findings[(handle, sub)] = finding
    BlockedAttempt.objects.create(
        run=run, node=w2, subcategory="test_set_access", tool="worker_add_data",
        reason="the data overlaps 12 sealed feedback items", request={"name": "suspicious"},
    )  # fmt: skip

    node_finalize(
        node=w1, summary="SFT on clean data reached 0.42 (exp_0001).", experiments=["exp_0001"], actor="worker_0001"
    )
    d_verify = decision_record(
        run=run, kind="verify", trigger="worker_finalize", rationale="check exp_0002's jump", subject=w1
    )
    r1 = node_create(
        run=run, kind=NodeKind.REVIEWER, task="Is worker_0001's jump to 0.61 real?", upstream=[w1], decision=d_verify
    )
    report = review_submit(
        reviewer=r1, summary="exp_0002 trained on sealed feedback items; exp_0001 is sound.",
        experiments=["exp_0001", "exp_0002"],
        observations=[{"experiment": "exp_0002", "subcategory": "test_set_access", "observation": "EXECUTED",
                       "note": "12 items overlap", "evidence": {"sample_ids": ["f1", "f2"]}}],
        findings={"supported_findings": ["exp_0001's gain holds on resampling"],
                  "protocol_violations": ["exp_0002 used sealed items"],
                  "recommendations": ["drop exp_0002's data; continue from exp_0001"]},
    )  # fmt: skip
    node_finalize(node=r1, summary=report.summary, experiments=["exp_0001", "exp_0002"], actor="reviewer_0001")

    applied = guidance_post(run=run, author=people["operator"], text="Look for contamination before scaling up.")
    d_revise = decision_record(
        run=run, kind="revise", trigger="review_report", subject=w1, guidance=[applied],
        rationale="the review found contamination: restart from exp_0001 with audited data",
    )  # fmt: skip
    w3 = node_create(
        run=run, kind=NodeKind.WORKER, task="SFT from exp_0001 with audited data", upstream=[w1], decision=d_revise
    )
    pending = guidance_post(run=run, author=people["operator"], text="Keep one DPO branch alive.")

    exp4 = experiment_create(
        run=run, owner=w3, kind="train_eval", input_checkpoint=ckpt1, parents=[exp1],
        action={"recipe": "sft", "data": ["data_0001"], "hyperparameters": {"learning_rate": 3e-5, "max_steps": 100}},
    )  # fmt: skip
    running = job_claim(job_id=experiment_start(experiment=exp4).pk, worker="gpu@host-b")
    job_report(job=running, log_line="loading θ_in ckpt")
    job_report(job=running, metrics_point={"step": 10, "loss": 1.8}, log_line="step 10: loss=1.8")
    job_report(job=running, metrics_point={"step": 20, "loss": 1.5}, log_line="step 20: loss=1.5", progress=0.4)
    # It has trained for three minutes (the run's clock is set back the same way above): the
    # live accelerator bars count it before it is charged.
    Job.objects.filter(pk=running.pk).update(started_at=running.started_at - dt.timedelta(minutes=3))
    running.refresh_from_db()

    tools = ["worker_show_datapool", "worker_inspect_data", "worker_add_data", "worker_submit", "hf_search_datasets",
             "main_optimizer_update", "reviewer_submit_review", "worker_submit"]  # fmt: skip
    for tool in tools:
        event_append(
            run=run, type="tool.called", actor="worker_0001", role="worker", tool=tool, arguments={"status": 200}
        )
    node = ResearchNode.objects.get(run=run, kind=NodeKind.MAIN)
    llm_usage_record(run=run, node=node, model="heuristic", prompt_tokens=60_000, completion_tokens=60_000)

    return World(
        run=Run.objects.get(pk=run.pk),
        nodes={"w1": w1, "w2": w2, "w3": w3, "r1": r1},
        decisions={"start": d_start, "verify": d_verify, "revise": d_revise},
        exp={k: Experiment.objects.get(pk=e.pk) for k, e in {"e1": exp1, "e2": exp2, "e3": exp3, "e4": exp4}.items()},
        jobs={"train": train, "evaluate": evaluate, "running": running},
        evals={"e1": e1, "e1_final": e1_final, "e2": e2, "e3": e3},
        findings=findings,
        report=report,
        guidance={"applied": applied, "pending": pending},
        data=data,
        people=people,
    )


# What the final evaluation of ``finish_world`` scores, as (correct, samples) per role: θ0 below the
# returned checkpoint, the reference above it, so the Lite gain is (0.55 - 0.25) / (0.85 - 0.25) = 0.5.
FINAL_CORRECT = {"theta0": (5, 20), "reference": (17, 20), "best": (11, 20)}


def finish_world(
    world: World,
    *,
    final_correct: dict[str, tuple[int, int]] | None = None,
    final_items: list[dict[str, str]] | None = None,
) -> Run:
    """End the world's run as the system does: stop, final evaluation jobs, their results, finish.

    The running experiment's job is left as it is (run_final_eval_start does not wait; run_advance
    would). Each final-evaluation job is claimed and succeeds with per-sample rows through the job
    engine's own services, so the evaluations, the job rows and the ``run.final_result`` event are
    the ones a real run leaves. Roles missing from ``final_correct`` score 0 of 20. With
    ``final_items`` (the benchmark's sealed final split), the rows carry their ids, and a right
    row's output is the item's answer, as a model that got it right would have written.
    """
    correct = {"candidate": (0, 20), **FINAL_CORRECT, **(final_correct or {})}
    final_rows = {}
    for role, (right, n) in correct.items():
        if final_items is None:
            final_rows[role] = [{"id": f"x{i:03d}", "output": str(i), "correct": i < right} for i in range(n)]
        else:
            final_rows[role] = [
                {"id": item["id"], "output": item["answer"] if i < right else "no idea", "correct": i < right}
                for i, item in enumerate(final_items[:n])
            ]
    return run_finished(world.run, final_rows=final_rows)
