"""Evaluation checks: the harness and verifier, access to the sealed test set, and sample inclusion."""

from __future__ import annotations

from typing import Any

from apps.benchmarks.services import SealBroken, benchmark_load_sealed, benchmark_scorer
from apps.experiments.choices import EvaluationStatus
from apps.experiments.models import EvaluationSample, Experiment
from apps.integrity.checks.subject import MAX_LISTED, CheckCannotRun, CheckResult, Subject, _clean
from apps.integrity.choices import Observation, Subcategory
from apps.integrity.models import BlockedAttempt


def check_harness_verifier(subject: Subject) -> CheckResult:
    """Each evaluation recorded the benchmark's evaluator, settings and data hashes, and re-scoring its
    recorded outputs with the sealed evaluator gives the recorded verdicts and aggregate."""
    codes: list[str] = []
    records: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    for evaluation in subject.evaluations:
        benchmark = evaluation.benchmark
        record: dict[str, Any] = {
            "evaluation": str(evaluation.uuid),
            "split": evaluation.split,
            "status": evaluation.status,
        }
        if evaluation.status == EvaluationStatus.REFUSED:
            refused.append({"evaluation": str(evaluation.uuid), "reason": evaluation.refusal_reason})
            records.append(record)
            continue
        if benchmark.pk != subject.benchmark.pk:
            codes.append("other_benchmark")
            record["benchmark"] = str(benchmark)
        for field_name, want in (
            ("evaluator_sha256", benchmark.evaluator_sha256),
            ("settings_sha256", benchmark.settings_sha256),
            ("data_sha256", str(benchmark.data_sha256.get(evaluation.split, ""))),
        ):
            if getattr(evaluation, field_name) != want:
                codes.append(f"{field_name.removesuffix('_sha256')}_hash_mismatch")
                record[field_name] = {"recorded": getattr(evaluation, field_name), "registered": want}
        try:
            rows, _ = benchmark_load_sealed(benchmark=benchmark, split=evaluation.split)
            scorer = benchmark_scorer(benchmark=benchmark)
        except SealBroken as exc:
            raise CheckCannotRun(
                f"the sealed benchmark no longer verifies, so nothing can be re-scored: {exc.reason}"
            ) from None
        answers = {r["id"]: r["answer"] for r in rows}
        samples = list(
            EvaluationSample.objects.filter(evaluation=evaluation).values_list("sample_id", "output", "correct")
        )
        mismatched = [
            sid for sid, output, correct in samples if sid in answers and scorer(output, answers[sid]) != correct
        ]
        recorded_correct = sum(1 for _, _, correct in samples if correct)
        rescored = sum(1 for sid, output, _ in samples if sid in answers and scorer(output, answers[sid]))
        record.update({"samples": len(samples), "recorded_correct": evaluation.correct, "rescored_correct": rescored})
        if mismatched:
            codes.append("rescore_mismatch")
            record["mismatched_samples"] = mismatched[:MAX_LISTED]
        expected_score = evaluation.correct / evaluation.sample_count if evaluation.sample_count else 0.0
        if recorded_correct != evaluation.correct or abs((evaluation.score or 0.0) - expected_score) > 1e-9:
            codes.append("aggregate_mismatch")
        records.append(record)
    evidence = {"evaluations": records, "refused": refused}
    if codes:
        return CheckResult(
            Observation.EXECUTED, codes, f"{', '.join(sorted(set(codes)))} in {len(records)} evaluation(s)", evidence
        )
    if refused:
        return CheckResult(
            Observation.ATTEMPTED_BLOCKED,
            ["seal_refused"],
            f"the seal refused {len(refused)} evaluation(s): {refused[0]['reason'][:200]}",
            evidence,
        )
    if not records:
        if subject.succeeded:
            raise CheckCannotRun(f"{subject.experiment.handle} succeeded but records no evaluation")
        return _clean("nothing was evaluated", **evidence)
    return _clean(f"{len(records)} evaluation(s) used the sealed evaluator; re-scoring agrees", **evidence)


def _experiment_window(subject: Subject) -> tuple[Any, Any]:
    """The window of an experiment's owner's blocked attempts that belong to it: (previous, this].

    A refused request creates no experiment, so what a Worker tried between two submissions belongs
    to the submission that followed: after the owner's previous submission (the window is open
    below when there is none) up to and including this one's creation. An attempt after this
    submission belongs to the next one, never to this one too.
    """
    experiment = subject.experiment
    previous = (
        Experiment.objects.filter(owner=experiment.owner, pk__lt=experiment.pk)
        .order_by("-pk")
        .values_list("created_at", flat=True)
        .first()
    )
    return previous, experiment.created_at


def check_test_set_access(subject: Subject) -> CheckResult:
    """No evaluation of this experiment touched the final split, and every denied read of sealed
    material by its Worker in this submission's window (after its previous submission, up to this
    one) is listed with the call that tried."""
    finals = [str(e.uuid) for e in subject.evaluations if e.split != "feedback"]
    since, until = _experiment_window(subject)
    attempts = BlockedAttempt.objects.filter(
        run=subject.run,
        node=subject.experiment.owner,
        subcategory=Subcategory.TEST_SET_ACCESS,
        created_at__lte=until,
    )
    if since is not None:
        attempts = attempts.filter(created_at__gt=since)
    listed = [
        {"tool": a.tool, "reason": a.reason[:500], "request": _brief(a.request), "at": a.created_at.isoformat()}
        for a in attempts.order_by("created_at", "pk")[:MAX_LISTED]
    ]
    evidence = {
        "final_split_evaluations": finals,
        "blocked_attempts": listed,
        "window": {"after": since.isoformat() if since is not None else None, "until": until.isoformat()},
    }
    if finals:
        return CheckResult(
            Observation.EXECUTED,
            ["final_split_evaluated"],
            f"{len(finals)} evaluation(s) of this submission ran on the sealed final split",
            evidence,
        )
    if listed:
        return CheckResult(
            Observation.ATTEMPTED_BLOCKED,
            ["sealed_read_denied"],
            f"{len(listed)} denied attempt(s) to read sealed material, e.g. {listed[0]['tool']}: "
            f"{listed[0]['reason'][:120]}",
            evidence,
        )
    return _clean("no evaluation touched the final split; no denied sealed read", **evidence)


def _brief(request: Any) -> Any:
    """A blocked call's arguments without the bulky evidence (the BlockedAttempt row keeps all of it)."""
    if isinstance(request, dict):
        return {k: v for k, v in request.items() if k != "evidence"}
    return request


def check_sample_inclusion(subject: Subject) -> CheckResult:
    """Each evaluation accounts for exactly the benchmark split's registered sample ids, once each."""
    codes: list[str] = []
    records = []
    for evaluation in subject.evaluations:
        if evaluation.status != EvaluationStatus.OK:
            continue
        expected = list(evaluation.benchmark.sample_ids.get(evaluation.split, []))
        recorded = list(EvaluationSample.objects.filter(evaluation=evaluation).values_list("sample_id", flat=True))
        missing = sorted(set(expected) - set(recorded))
        extra = sorted(set(recorded) - set(expected))
        record = {
            "evaluation": str(evaluation.uuid),
            "split": evaluation.split,
            "expected": len(expected),
            "recorded": len(recorded),
            "sample_count": evaluation.sample_count,
        }
        if missing or extra or len(recorded) != len(expected) or evaluation.sample_count != len(expected):
            codes.append("sample_ids_mismatch")
            record.update(
                {
                    "missing": missing[:MAX_LISTED],
                    "extra": extra[:MAX_LISTED],
                    "missing_count": len(missing),
                    "extra_count": len(extra),
                }
            )
        records.append(record)
    evidence = {"evaluations": records}
    if codes:
        worst = max(records, key=lambda r: r.get("missing_count", 0) + r.get("extra_count", 0))
        return CheckResult(
            Observation.EXECUTED,
            codes,
            f"an evaluation scored {worst['recorded']} of {worst['expected']} registered samples "
            f"({worst.get('missing_count', 0)} missing, {worst.get('extra_count', 0)} extra)",
            evidence,
        )
    if not records:
        if subject.succeeded:
            raise CheckCannotRun(f"{subject.experiment.handle} succeeded but records no completed evaluation")
        return _clean("nothing was evaluated", **evidence)
    return _clean(f"{len(records)} evaluation(s) account for every registered sample id", **evidence)
