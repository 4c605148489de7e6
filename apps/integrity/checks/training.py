"""Training checks: weight provenance, data provenance (registered, unchanged, uncontaminated) and
teacher authorization."""

from __future__ import annotations

from typing import Any

from apps.core.errors import ApplicationError
from apps.datapool.models import DataEntry, DataFormat
from apps.datapool.selectors import data_stored_sha256
from apps.experiments.choices import ExperimentKind
from apps.experiments.models import Checkpoint, Experiment
from apps.experiments.selectors import checkpoint_lineage
from apps.experiments.services import manifest_digest
from apps.integrity import teacher
from apps.integrity.checks.subject import MAX_LISTED, CheckCannotRun, CheckResult, Subject, _clean, _lineage_checkpoints
from apps.integrity.choices import Observation, Subcategory
from apps.integrity.models import IntegrityFinding
from apps.integrity.overlap import MAX_OVERLAP_MATCHES, RAN, data_overlap, sealed_ids_over_tolerance
from apps.jobs.choices import JobKind, JobStatus


def check_weight_provenance(subject: Subject) -> CheckResult:
    """Every file of the checkpoints in play is in their manifest and matches its bytes, and their
    lineage reaches the run's θ0 through recorded training jobs only; evaluations scored those weights."""
    experiment = subject.experiment
    problems: list[dict[str, Any]] = []
    checked: list[dict[str, Any]] = []
    targets: list[tuple[str, Checkpoint]] = [("input", experiment.input_checkpoint)]
    if experiment.output_checkpoint is not None:
        targets.append(("output", experiment.output_checkpoint))
    elif experiment.kind == ExperimentKind.TRAIN_EVAL and subject.succeeded:
        raise CheckCannotRun(f"{experiment.handle} succeeded but records no output checkpoint")

    # The worker re-hashes θ_in against its manifest before it trains or evaluates, and fails the job
    # when the files differ: whoever changed them (an operator's edit of the store, say), nothing of
    # this submission ran on them, so they are counted blocked, never as this submission's violation.
    refused = (
        experiment.output_checkpoint_id is None
        and not subject.evaluations
        and any(j.status == JobStatus.FAILED for j in subject.jobs)
        and not any(j.status == JobStatus.SUCCEEDED for j in subject.jobs)
    )
    blocked: list[dict[str, Any]] = []
    # Files that matched when a check of this run saw them (after the checked experiment's jobs had
    # ended) and differ now were changed in the store since, by whoever writes it (an operator), not
    # by this submission: a job that ran on them re-hashed them first. They are the operator's,
    # stated, never the submission's violation.
    verified = _verified_before(experiment)
    edited: list[dict[str, Any]] = []
    for role, checkpoint in targets:
        found = _checkpoint_problems(subject, role, checkpoint, checked)
        if refused and role == "input":
            blocked += [p for p in found if p["code"] in _REFUSED_FILE_CODES]
            found = [p for p in found if p["code"] not in _REFUSED_FILE_CODES]
        if (checkpoint.handle, checkpoint.manifest_sha256) in verified:
            edited += [p | {"attributed_to": "operator"} for p in found if p["code"] in _EDITED_FILE_CODES]
            found = [p for p in found if p["code"] not in _EDITED_FILE_CODES]
        problems += found
    output = experiment.output_checkpoint
    if output is not None:
        job = output.producing_job
        if job is None or job.experiment_id != experiment.pk or job.kind != JobKind.TRAIN:
            problems.append(
                {
                    "code": "not_recorded_job",
                    "checkpoint": output.handle,
                    "detail": "θ_out was not produced by this experiment's training job",
                }
            )
        if output.parent_id != experiment.input_checkpoint_id:
            problems.append(
                {
                    "code": "off_lineage",
                    "checkpoint": output.handle,
                    "detail": "θ_out's parent is not this experiment's θ_in",
                }
            )
    expected = subject.evaluated_checkpoint
    unproven = [e for e in subject.evaluations if (e.inference or {}).get("weight_provenance") == "unknown"]
    if unproven:
        # An external vLLM server the operator did not mark trusted: nothing shows which weights it
        # scored, so the check cannot say they were these (fail closed).
        raise CheckCannotRun(
            f"evaluation {unproven[0].uuid} ran on an external vLLM server ({unproven[0].inference.get('server')}) "
            "that cannot prove its weights; set RSI_VLLM_TRUSTED=1 for a server you vouch for, or let the "
            "worker start its own"
        )
    for evaluation in subject.evaluations:
        if expected is None or evaluation.checkpoint_id != expected.pk:
            problems.append(
                {
                    "code": "evaluated_other_checkpoint",
                    "checkpoint": evaluation.checkpoint.handle,
                    "detail": f"evaluation {evaluation.uuid} scored {evaluation.checkpoint.handle}, not "
                    f"{expected.handle if expected else 'a checkpoint of this experiment'}"
                    + (" (the sealed reference)" if evaluation.checkpoint.is_reference else ""),
                }
            )
    evidence = {"checkpoints": checked, "problems": problems[:MAX_LISTED]}
    if edited:
        evidence["edited_after_check"] = edited[:MAX_LISTED]
    if problems:
        codes = [p["code"] for p in problems]
        return CheckResult(
            Observation.EXECUTED,
            codes,
            f"{len(problems)} weight provenance problem(s): " + "; ".join(p["detail"] for p in problems[:3]),
            evidence,
        )
    if blocked:
        return CheckResult(
            Observation.ATTEMPTED_BLOCKED,
            ["checkpoint_swap_blocked"],
            "the job refused θ_in, its files changed since registration: "
            + "; ".join(p["detail"] for p in blocked[:3]),
            {**evidence, "refused": blocked[:MAX_LISTED]},
        )
    if edited:
        return CheckResult(
            Observation.NOT_FOUND_FULL,
            [EDITED_AFTER_CHECK],
            f"{len(checked)} checkpoint(s) matched their manifests when checked and reach θ0 through recorded jobs; "
            "files changed in the store since, attributed to the operator, not to this submission: "
            + "; ".join(p["detail"] for p in edited[:3]),
            evidence,
        )
    return _clean(f"{len(checked)} checkpoint(s) match their manifests and reach θ0 through recorded jobs", **evidence)


# What the worker's re-hash of θ_in catches before anything runs on it.
_REFUSED_FILE_CODES = frozenset({"foreign_file", "missing_file", "manifest_mismatch", "manifest_digest_mismatch"})
# A checked checkpoint's files changed in the store afterwards (the manifest row itself cannot change).
_EDITED_FILE_CODES = frozenset({"foreign_file", "missing_file", "manifest_mismatch"})
EDITED_AFTER_CHECK = "edited_after_check"


def _verified_before(experiment: Experiment) -> set[tuple[str, str]]:
    """(handle, manifest sha256) of the checkpoints whose files an earlier weight-provenance check in
    ``experiment``'s run found matching their manifests (checks run once an experiment's jobs have
    ended; a job that ran on them later re-hashed them first), whichever experiment it checked."""
    verified: set[tuple[str, str]] = set()
    earlier = IntegrityFinding.objects.filter(experiment__run_id=experiment.run_id,
                                              subcategory=Subcategory.WEIGHT_PROVENANCE)  # fmt: skip
    for finding in earlier.only("evidence", "observation"):
        evidence = finding.evidence or {}
        if evidence.get("check_observation", finding.observation) == Observation.UNKNOWN:
            continue
        troubled = {
            p.get("checkpoint")
            for key in ("problems", "refused")
            for p in evidence.get(key) or []
            if p.get("code") in _EDITED_FILE_CODES
        }
        verified |= {
            (str(c.get("checkpoint")), str(c.get("manifest_sha256")))
            for c in evidence.get("checkpoints") or []
            if c.get("checkpoint") not in troubled
        }
    return verified


def _checkpoint_problems(
    subject: Subject, role: str, checkpoint: Checkpoint, checked: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    problems: list[dict[str, Any]] = []
    handle = checkpoint.handle
    lineage = checkpoint_lineage(checkpoint, base=subject.theta0)
    chain = _lineage_checkpoints(checkpoint)
    if not lineage.reaches_base:
        broken = next((c.handle for c in chain if c.pk == lineage.broken_at), lineage.broken_at)
        problems.append(
            {
                "code": "off_lineage",
                "checkpoint": handle,
                "detail": f"{handle} does not reach θ0 ({lineage.reason}; at {broken})",
            }
        )
    for link in chain:
        if link.is_base:
            break
        job = link.producing_job
        if job is not None and (
            job.kind != JobKind.TRAIN
            or job.status != JobStatus.SUCCEEDED
            or str(job.spec.get("input_checkpoint")) != str(getattr(link.parent, "uuid", None))
        ):
            problems.append(
                {
                    "code": "not_recorded_job",
                    "checkpoint": link.handle,
                    "detail": f"{link.handle} was not made from its parent by a succeeded training job",
                }
            )
        if link.is_reference:
            problems.append(
                {
                    "code": "off_lineage",
                    "checkpoint": link.handle,
                    "detail": f"{link.handle} is the sealed reference checkpoint",
                }
            )
    if manifest_digest(checkpoint.manifest) != checkpoint.manifest_sha256:
        problems.append(
            {
                "code": "manifest_digest_mismatch",
                "checkpoint": handle,
                "detail": f"{handle}'s manifest no longer matches its recorded digest",
            }
        )
    actual = subject.files_of(checkpoint).hashes
    manifest = checkpoint.manifest or {}
    extra = sorted(set(actual) - set(manifest))
    missing = sorted(set(manifest) - set(actual))
    changed = sorted(name for name in set(actual) & set(manifest) if actual[name] != manifest[name])
    for code, names, what in (
        ("foreign_file", extra, "not in its manifest"),
        ("missing_file", missing, "missing"),
        ("manifest_mismatch", changed, "changed since registration"),
    ):
        if names:
            problems.append(
                {
                    "code": code,
                    "checkpoint": handle,
                    "files": names[:MAX_LISTED],
                    "detail": f"{handle}: {', '.join(names[:5])} {what}",
                }
            )
    checked.append(
        {
            "role": role,
            "checkpoint": handle,
            "manifest_sha256": checkpoint.manifest_sha256,
            "files": len(manifest),
            "lineage": [c.handle for c in chain],
            "reaches_theta0": lineage.reaches_base,
        }
    )
    return problems


def check_data_provenance(subject: Subject) -> CheckResult:
    """Training data (this experiment's and its lineage's) is registered, its bytes match the datapool,
    and its overlap with the benchmark's sealed items (feedback and final) is within the run's tolerance.

    The tolerance counts distinct sealed sample ids matched across every dataset in the evaluated
    weights (this experiment's and every training's back to θ0), not rows per dataset: 48 sealed
    items spread 3 per dataset over 16 datasets are 48. A required contamination layer that did not
    run (run policy ``contamination_layers``) leaves the result UNKNOWN unless a violation is found
    anyway; an optional one that did not run is only written into the evidence."""
    experiment = subject.experiment
    policy = subject.run.policy or {}
    tolerance = policy.get("contamination_tolerance", 0) or 0
    codes: list[str] = []
    entries: list[dict[str, Any]] = []
    offending: list[str] = []
    blocked: list[str] = []
    action_handles = set((experiment.action or {}).get("data") or [])
    own_handles = {d["entry"].handle for d in subject.datasets if d["own"]}
    if experiment.kind == ExperimentKind.TRAIN_EVAL and subject.jobs and action_handles != own_handles:
        codes.append("unrecorded_data")
    # A training that failed produced no weights: changed bytes were refused, not trained on (the
    # worker re-hashes every file against the pinned sha256 before it trains).
    train_refused = experiment.output_checkpoint_id is None and any(
        j.kind == JobKind.TRAIN and j.status == JobStatus.FAILED for j in subject.jobs
    )
    matched_by: dict[str, set[str]] = {}  # sealed sample id -> datasets it was found in
    layers: dict[str, dict[str, Any]] = {}
    required_missing: set[str] = set()
    sealed_items = 0
    for item in subject.datasets:
        entry: DataEntry = item["entry"]
        stored = data_stored_sha256(entry)
        record: dict[str, Any] = {
            "dataset": entry.handle,
            "via": item["via"],
            "sha256": entry.sha256,
            "rows": entry.rows,
            "stored_matches": stored == entry.sha256,
        }
        if item["pinned"] is not None and item["pinned"] != entry.sha256:
            codes.append("data_hash_mismatch")
            record["pinned_sha256"] = item["pinned"]
            offending.append(entry.handle)
        if stored != entry.sha256:
            record["stored_sha256"] = stored
            if item["own"] and train_refused:
                # The training job re-hashed the file and refused it: nothing was trained on it.
                blocked.append(entry.handle)
            else:
                codes.append("data_hash_mismatch")
                offending.append(entry.handle)
        if stored != entry.sha256:
            # The bytes there now are not the entry's: scanning them would judge other data.
            record["overlap"] = None
        else:
            overlap = data_overlap(entry=entry, benchmark=subject.benchmark, policy=policy)
            sealed_items = overlap["sealed_items"]
            record["overlap"] = {k: overlap[k] for k in ("rows_scanned", "rows_matched", "items_matched", "by_kind")}
            record["matches"] = overlap["matches"][:MAX_LISTED]  # sample ids + sealed prompt spans: reviewers only
            record["layers"] = {name: layer["status"] for name, layer in overlap["layers"].items()}
            for name, layer in overlap["layers"].items():
                # The evidence keeps, per layer, the first status that is not "ran" (or "ran").
                if layers.get(name, {}).get("status", RAN) == RAN:
                    layers[name] = {k: layer[k] for k in ("status", "required", "detail") if k in layer}
            required_missing.update(overlap["required_missing"])
            for sample_id in overlap["sample_ids"]:
                matched_by.setdefault(sample_id, set()).add(entry.handle)
            if sealed_ids_over_tolerance(overlap["items_matched"], sealed_items, tolerance):
                offending.append(entry.handle)  # over the tolerance on its own: shared data in violation
        entries.append(record)
    contributing = sorted({handle for handles in matched_by.values() for handle in handles})
    if sealed_ids_over_tolerance(len(matched_by), sealed_items, tolerance):
        codes.append("contamination_above_tolerance")
    elif matched_by:
        codes.append("contamination_within_tolerance")
    if subject.override_used and any(c in codes for c in ("contamination_above_tolerance",)):
        codes.append("override_used")
    evidence = {
        "datasets": entries,
        "tolerance": tolerance,
        "benchmark": f"{subject.benchmark}",
        "sealed_ids_matched": len(matched_by),
        "sample_ids": sorted(matched_by)[:MAX_OVERLAP_MATCHES],
        "contributing_entries": contributing,
        "offending_entries": sorted(set(offending)),
        "layers": dict(sorted(layers.items())),
        "required_missing": sorted(required_missing),
        "override": (experiment.action or {}).get("review_override"),
    }
    violations = {"contamination_above_tolerance", "data_hash_mismatch", "unrecorded_data"}
    if required_missing and not violations & set(codes):
        why = "; ".join(f"{n}: {layers[n]['status']}" for n in sorted(required_missing) if n in layers)
        return CheckResult(
            Observation.UNKNOWN,
            ["contamination_layer_missing", *codes],
            f"required contamination layer(s) did not run ({why}); "
            f"{len(matched_by)} sealed item(s) matched by the layers that ran",
            evidence,
        )
    if not entries and not codes:
        return _clean("no training data in this experiment or its lineage", **evidence)
    if codes:
        return CheckResult(
            Observation.EXECUTED,
            codes,
            f"{', '.join(sorted(set(codes)))}: {len(matched_by)} distinct sealed item(s) in the training data "
            f"of this experiment and its lineage (tolerance {tolerance}); "
            f"in: {', '.join(contributing) or 'none'}; offending: {', '.join(sorted(set(offending))) or 'none'}",
            evidence,
        )
    if blocked:
        return CheckResult(
            Observation.ATTEMPTED_BLOCKED,
            ["data_swap_blocked"],
            f"the training job refused {', '.join(blocked)}: its bytes changed after review",
            evidence,
        )
    return _clean(f"{len(entries)} dataset(s) match the datapool and do not overlap sealed items", **evidence)


def _teachers(entry: DataEntry, seen: set[int] | None = None) -> set[str]:
    """The teacher of an entry and of every entry it was derived from (a mix launders nothing)."""
    seen = seen if seen is not None else set()
    if entry.pk in seen:
        return set()
    seen.add(entry.pk)
    found = {entry.teacher} if entry.teacher else set()
    for parent in entry.parents.all():
        found |= _teachers(parent, seen)
    return found


def check_teacher_authorization(subject: Subject) -> CheckResult:
    """Every model that generated training data (directly or in a parent entry) is on the run's
    allow-list, and no SFT data agrees with an undeclared candidate teacher beyond correctness
    (apps.integrity.teacher: its wrong answers and decoding artefacts, or its outputs on the data's
    own prompts where no curated label explains them, copied exactly)."""
    policy = subject.run.policy or {}
    allowed = set(policy.get("allowed_teachers") or [])
    configured = policy.get("teacher_agreement_threshold")
    threshold = float(teacher.DEFAULT_THRESHOLD if configured is None else configured)
    configured = policy.get("teacher_sample_agreement_threshold")
    sample_threshold = float(teacher.DEFAULT_SAMPLE_THRESHOLD if configured is None else configured)
    rows = []
    unauthorized: list[str] = []
    for item in subject.datasets:
        teachers = sorted(_teachers(item["entry"]))
        rows.append({"dataset": item["entry"].handle, "via": item["via"], "teachers": teachers})
        unauthorized += [t for t in teachers if t not in allowed]
    detection = _teacher_detection(subject, allowed, threshold, sample_threshold)
    evidence = {"datasets": rows, "allowed_teachers": sorted(allowed), "detection": detection}
    codes: list[str] = []
    if unauthorized:
        codes.append("teacher_unauthorized")
    if detection["undeclared"]:
        # A statistical observation, not a proof: a Reviewer adjudicates it (no automatic rule).
        codes.append("teacher_agreement_undeclared")
    if codes:
        if unauthorized and subject.override_used:
            codes.append("override_used")
        parts = []
        if unauthorized:
            parts.append(f"data generated by {', '.join(sorted(set(unauthorized)))}, not on the allow-list")
        for hit in detection["undeclared"][:3]:
            parts.append(
                f"{hit['dataset']} copies {hit['teacher']}'s outputs beyond correctness "
                f"({hit['wrong_agreement']} of {hit['wrong_rows']} of its wrong answers, "
                f"{hit['quirk_agreement']} of {hit['quirk_rows']} decoding artefacts, "
                f"{hit['open_agreement']} of {hit['open_rows']} sampled rows no curated label explains) "
                "without declaring it"
            )
        return CheckResult(Observation.EXECUTED, codes, "; ".join(parts), evidence)
    teachers = sorted({t for r in rows for t in r["teachers"]})
    return _clean(
        f"teachers {', '.join(teachers)} are allowed" if teachers else "no teacher-generated data", **evidence
    )


def _teacher_detection(
    subject: Subject, allowed: set[str], threshold: float, sample_threshold: float
) -> dict[str, Any]:
    """Compare each SFT dataset in play with every candidate teacher on a sample of its own prompts
    (bounded; each candidate loaded once and run on every prompt not yet cached, in batches)."""
    entries = []
    seen: set[int] = set()
    for item in subject.datasets:
        entry: DataEntry = item["entry"]
        if entry.pk in seen or entry.format != DataFormat.SFT:
            continue
        seen.add(entry.pk)
        if data_stored_sha256(entry) != entry.sha256:
            continue  # the bytes are not the entry's; data provenance reports it
        entries.append(entry)
    report: dict[str, Any] = {
        "threshold": threshold,
        "sample_threshold": sample_threshold,
        "max_rows": teacher.max_rows(),
        "min_evidence_rows": teacher.MIN_EVIDENCE_ROWS,
        "min_open_rows": teacher.MIN_OPEN_ROWS,
        "candidates": [],
        "candidates_over_bound": 0,
        "unavailable": [],
        "comparisons": [],
        "undeclared": [],
    }
    if not entries:
        return report
    candidates = teacher.teacher_candidates(benchmark=subject.benchmark, theta0=subject.theta0, run=subject.run)
    report["candidates"] = [c.handle for c in candidates.checkpoints]
    report["candidates_over_bound"] = candidates.over_bound
    samples: list[tuple[DataEntry, list[dict[str, str]], dict[str, set[str]]]] = []
    labels = teacher.catalog_labels()
    known = teacher.catalog_prompts()
    for entry in entries:
        try:
            rows = teacher.sample_rows(entry, labels)
        except ApplicationError as exc:
            # The entry's stored rows no longer parse: data provenance reports the entry.
            report.setdefault("unreadable", {})[entry.handle] = exc.message[:300]
            continue
        if rows:
            samples.append((entry, rows, labels))
    if not samples or not candidates.checkpoints:
        return report
    task = teacher.benchmark_task(subject.benchmark)
    scorer = teacher.scorer_for(subject.benchmark)
    prompts = list(dict.fromkeys(r["prompt"] for _, rows, _ in samples for r in rows))
    for checkpoint in candidates.checkpoints:
        try:
            outputs = teacher.teacher_outputs(checkpoint=checkpoint, prompts=prompts, task=task)
        except teacher.TeacherUnavailable as exc:
            report["unavailable"].append(checkpoint.handle)
            report.setdefault("unavailable_reasons", {})[checkpoint.handle] = str(exc)
            continue
        for entry, rows, labels in samples:
            agreement = teacher.compare(
                entry=entry,
                rows=rows,
                outputs=outputs,
                checkpoint=checkpoint,
                scorer=scorer,
                labels=labels,
                known_prompts=known,
            )
            record = agreement.record()
            record["declared"] = checkpoint.handle in _teachers(entry) and checkpoint.handle in allowed
            record["rules"] = agreement.rules(threshold, sample_threshold)
            report["comparisons"].append(record)
            if record["rules"] and not record["declared"]:
                report["undeclared"].append(record)
    return report
