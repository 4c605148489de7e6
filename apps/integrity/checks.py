"""The post-submission checks: one function per subcategory of the audit taxonomy (DESIGN.md "Integrity").

Each check reads the records of one experiment (and the files they point at) and returns a
:class:`CheckResult`: an observation, machine-readable ``codes`` for what it found, and evidence a
Reviewer can open. Checks never write; :mod:`apps.integrity.services` stores the results, applies
automatic adjudication by code and the acceptance rule.

Checks compare *meaning*, not bytes: a tokenizer re-saved with the same vocabulary, special tokens
and chat template is unchanged; a generation config that differs only in ``transformers_version``
is unchanged. They fail closed: a check that cannot reach what it must read raises
:class:`CheckCannotRun`, and any exception leaves the subcategory ``UNKNOWN`` (see :func:`run_check`).

``CHECKS`` is the registry the services iterate; it is looked up at call time, so a test can switch
one check off and watch the red team's rows turn red.
"""

from __future__ import annotations

import hashlib
import json
import re
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from apps.benchmarks.models import Benchmark
from apps.core.errors import ApplicationError
from apps.core.hashing import canonical_json
from apps.datapool.models import DataEntry, DataUsage
from apps.experiments.choices import EvaluationStatus, ExperimentKind, ExperimentStatus
from apps.experiments.models import Checkpoint, Evaluation, EvaluationSample, Experiment
from apps.experiments.selectors import checkpoint_lineage
from apps.experiments.services import manifest_digest
from apps.integrity.choices import Observation, Subcategory
from apps.integrity.models import BlockedAttempt
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job
from apps.research.choices import NodeStatus
from apps.research.models import OptimizerClaim, ResearchNode

# How much a piece of evidence may list: enough for a Reviewer to act on, bounded for the row.
MAX_LISTED = 50
# Generation-config keys that are bookkeeping, not decoding behaviour.
_GENERATION_IGNORED = {"transformers_version", "_from_model_config", "_commit_hash"}
# Generation-config keys that decide where generation stops (the stopping / EOS subcategory).
_GENERATION_STOPPING = {
    "eos_token_id",
    "pad_token_id",
    "stop_strings",
    "forced_eos_token_id",
    "suppress_tokens",
    "begin_suppress_tokens",
    "min_length",
    "min_new_tokens",
    "max_length",
    "max_new_tokens",
    "exponential_decay_length_penalty",
}
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
_STOPPING_SPECIALS = {"eos_token", "pad_token"}
# tokenizer_config keys that change how text becomes tokens or tokens become text.
_TOKENIZER_FLAGS = (
    "add_bos_token",
    "add_eos_token",
    "clean_up_tokenization_spaces",
    "do_lower_case",
    "add_prefix_space",
    "legacy",
    "split_special_tokens",
)
_TOKENIZER_PIPELINE = ("normalizer", "pre_tokenizer", "post_processor", "decoder")


class CheckCannotRun(Exception):  # noqa: N818 - an outcome (UNKNOWN), not a programming error
    """What a check must read is not there (a checkpoint folder, a sealed split): the result is UNKNOWN."""


@dataclass
class CheckResult:
    """One subcategory's observation for one experiment, with what it found and the evidence."""

    observation: str
    codes: list[str] = field(default_factory=list)
    summary: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_evidence(self) -> dict[str, Any]:
        return {"summary": self.summary, "codes": sorted(set(self.codes)), **self.evidence}


def _clean(summary: str, **evidence: Any) -> CheckResult:
    return CheckResult(Observation.NOT_FOUND_FULL, [], summary, evidence)


# --------------------------------------------------------------------------- reading checkpoint files


class CheckpointFiles:
    """The files of a registered checkpoint, read where its URI points: the artifact store (any
    fsspec URL, read directly rather than through a local cache, so a changed file is seen) or a
    ``file://`` folder (θ0 installed from a minibench folder, sealed references)."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        from apps.datapool.storage import artifact_store

        self.checkpoint = checkpoint
        uri = checkpoint.uri
        store = artifact_store()
        try:
            key = store.key(uri)
        except ApplicationError:
            if not uri.startswith("file:"):
                raise CheckCannotRun(
                    f"{checkpoint.handle}: {uri} is neither in the artifact store nor a file URL"
                ) from None
            import fsspec

            self.fs = fsspec.filesystem("file")
            self.base = unquote(urlparse(uri).path).rstrip("/")
        else:
            self.fs = store.fs
            self.base = f"{store.root.rstrip('/')}/{key}"

    def _exists(self) -> bool:
        return bool(self.fs.exists(self.base)) and bool(self.fs.isdir(self.base))

    @cached_property
    def hashes(self) -> dict[str, str]:
        """sha256 of every file under the checkpoint folder, keyed by relative POSIX path."""
        if not self._exists():
            raise CheckCannotRun(f"{self.checkpoint.handle}: the checkpoint folder {self.checkpoint.uri} is missing")
        out: dict[str, str] = {}
        prefix = self.base.rstrip("/") + "/"
        for path in sorted(self.fs.find(self.base)):
            relative = path[len(prefix) :] if path.startswith(prefix) else Path(path).name
            digest = hashlib.sha256()
            with self.fs.open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
            out[relative] = digest.hexdigest()
        return out

    def read_text(self, name: str) -> str | None:
        path = f"{self.base}/{name}"
        if not self.fs.exists(path):
            return None
        with self.fs.open(path, "rb") as handle:
            return handle.read().decode("utf-8")

    def read_json(self, name: str) -> Any:
        text = self.read_text(name)
        if text is None:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            # A config file that no longer parses is a difference in meaning, not a crash.
            return {"__unparseable__": f"{name}: {exc.msg}"}


def _token_content(value: Any) -> Any:
    """An AddedToken dict ({"content": "</s>", ...}) and its plain string mean the same token."""
    if isinstance(value, dict) and "content" in value:
        return value["content"]
    if isinstance(value, list):
        return [_token_content(v) for v in value]
    return value


def inference_profile(files: CheckpointFiles) -> dict[str, Any]:
    """What decides how a checkpoint generates, reduced to meaning (file layout and bookkeeping dropped).

    ``generation``: generation_config.json without version stamps. ``tokenizer``: the model
    (vocabulary, merges), added tokens, the normalisation / pre-tokenisation / post-processing /
    decoding pipeline and the flags that change encoding. ``specials``: special tokens, from
    tokenizer_config.json or special_tokens_map.json, whichever names them. ``chat_template``: the
    template text, from chat_template.jinja, chat_template.json or tokenizer_config.json.
    """
    generation = files.read_json("generation_config.json") or {}
    if isinstance(generation, dict):
        generation = {k: v for k, v in generation.items() if k not in _GENERATION_IGNORED}
    tokenizer_json = files.read_json("tokenizer.json") or {}
    config = files.read_json("tokenizer_config.json") or {}
    special_map = files.read_json("special_tokens_map.json") or {}
    specials: dict[str, Any] = {}
    for name in (*_SPECIAL_TOKENS, "additional_special_tokens"):
        value = config.get(name, special_map.get(name))
        if value is not None:
            specials[name] = _token_content(value)
    if isinstance(specials.get("additional_special_tokens"), list):
        specials["additional_special_tokens"] = sorted(map(str, specials["additional_special_tokens"]))
    added = sorted(
        (int(t.get("id", -1)), str(t.get("content")), bool(t.get("special")))
        for t in tokenizer_json.get("added_tokens", [])
        if isinstance(t, dict)
    )
    chat_template = files.read_text("chat_template.jinja")
    if chat_template is None:
        chat_json = files.read_json("chat_template.json")
        if isinstance(chat_json, dict):
            chat_template = chat_json.get("chat_template")
    if chat_template is None:
        chat_template = config.get("chat_template")
    return {
        "generation": generation,
        "tokenizer": {
            "model": tokenizer_json.get("model"),
            "added_tokens": [list(t) for t in added],
            **{k: tokenizer_json.get(k) for k in _TOKENIZER_PIPELINE},
            **{k: config.get(k) for k in _TOKENIZER_FLAGS if k in config},
            "unparseable": tokenizer_json.get("__unparseable__") or config.get("__unparseable__"),
        },
        "specials": specials,
        "chat_template": chat_template,
    }


def _differences(base: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Keys whose values differ between two flat dicts (missing counts as a difference)."""
    return sorted(k for k in set(base) | set(other) if canonical_json(base.get(k)) != canonical_json(other.get(k)))


# --------------------------------------------------------------------------- what one experiment is


@dataclass
class Subject:
    """Everything the checks read about one experiment, loaded once per pass."""

    experiment: Experiment
    _files: dict[int, CheckpointFiles] = field(default_factory=dict, repr=False)

    @property
    def run(self) -> Any:
        return self.experiment.run

    @property
    def benchmark(self) -> Benchmark:
        return self.experiment.run.benchmark

    @property
    def theta0(self) -> Checkpoint:
        return self.experiment.run.base_checkpoint

    @cached_property
    def evaluations(self) -> list[Evaluation]:
        return list(
            Evaluation.objects.filter(experiment=self.experiment)
            .select_related("checkpoint", "benchmark")
            .order_by("pk")
        )

    @cached_property
    def jobs(self) -> list[Job]:
        return list(Job.objects.filter(experiment=self.experiment).order_by("pk"))

    @property
    def evaluated_checkpoint(self) -> Checkpoint | None:
        """The checkpoint this experiment's scores are about: θ_out, or θ_in for an evaluation alone."""
        if self.experiment.kind == ExperimentKind.EVAL_ONLY:
            return self.experiment.input_checkpoint
        return self.experiment.output_checkpoint

    @property
    def succeeded(self) -> bool:
        return self.experiment.status == ExperimentStatus.SUCCEEDED

    def files_of(self, checkpoint: Checkpoint) -> CheckpointFiles:
        """One reader per checkpoint per pass, so each folder is hashed once however many checks ask."""
        if checkpoint.pk not in self._files:
            self._files[checkpoint.pk] = CheckpointFiles(checkpoint)
        return self._files[checkpoint.pk]

    @cached_property
    def run_experiments(self) -> dict[str, Experiment]:
        """Every experiment of the run by handle (reports cite them)."""
        experiments = Experiment.objects.filter(run=self.run).select_related("input_checkpoint", "output_checkpoint")
        return {e.handle: e for e in experiments}

    @cached_property
    def statements(self) -> list[Statement]:
        return statements_for(self.run)

    @cached_property
    def by_checkpoint(self) -> dict[str, frozenset[str]]:
        return evaluations_by_checkpoint(self.run)

    @cached_property
    def override_used(self) -> bool:
        return bool((self.experiment.action or {}).get("review_override"))

    @cached_property
    def datasets(self) -> list[dict[str, Any]]:
        """Every datapool entry whose rows are in the evaluated weights: this experiment's training
        data and that of every training job on the checkpoint's lineage back to θ0."""
        out: list[dict[str, Any]] = []
        seen: set[tuple[str, int]] = set()

        def add(entry: DataEntry, *, via: str, job: Job | None, pinned: str | None) -> None:
            if (via, entry.pk) in seen:
                return
            seen.add((via, entry.pk))
            out.append({"entry": entry, "via": via, "job": job, "pinned": pinned, "own": via == self.experiment.handle})

        for job in self.jobs:
            if job.kind == JobKind.TRAIN:
                for item in job.spec.get("data", []):
                    entry = DataEntry.objects.filter(uuid=item.get("uuid")).first()
                    if entry is not None:
                        add(entry, via=self.experiment.handle, job=job, pinned=item.get("sha256"))
        for usage in DataUsage.objects.filter(experiment=self.experiment).select_related("entry"):
            add(usage.entry, via=self.experiment.handle, job=None, pinned=None)
        start = self.evaluated_checkpoint or self.experiment.input_checkpoint
        for checkpoint in _lineage_checkpoints(start):
            if checkpoint.pk == getattr(self.experiment.output_checkpoint, "pk", None):
                continue  # this experiment's own data was added above
            job = checkpoint.producing_job
            if job is None or job.kind != JobKind.TRAIN:
                continue
            via = job.experiment.handle if job.experiment_id else f"job:{job.uuid}"
            for item in job.spec.get("data", []):
                entry = DataEntry.objects.filter(uuid=item.get("uuid")).first()
                if entry is not None:
                    add(entry, via=via, job=job, pinned=item.get("sha256"))
        return out


def _lineage_checkpoints(checkpoint: Checkpoint | None) -> list[Checkpoint]:
    if checkpoint is None:
        return []
    ids = checkpoint_lineage(checkpoint).path
    found = {c.pk: c for c in Checkpoint.objects.filter(pk__in=ids).select_related("producing_job__experiment")}
    return [found[i] for i in ids if i in found]


# --------------------------------------------------------------------------- training


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

    for role, checkpoint in targets:
        problems += _checkpoint_problems(subject, role, checkpoint, checked)
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
    if problems:
        codes = [p["code"] for p in problems]
        return CheckResult(
            Observation.EXECUTED,
            codes,
            f"{len(problems)} weight provenance problem(s): " + "; ".join(p["detail"] for p in problems[:3]),
            evidence,
        )
    return _clean(f"{len(checked)} checkpoint(s) match their manifests and reach θ0 through recorded jobs", **evidence)


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


def _stored_sha256(entry: DataEntry) -> str | None:
    from apps.datapool.storage import artifact_store

    digest = hashlib.sha256()
    try:
        with artifact_store().open(entry.uri, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except (ApplicationError, OSError):
        return None
    return digest.hexdigest()


def check_data_provenance(subject: Subject) -> CheckResult:
    """Training data (this experiment's and its lineage's) is registered, its bytes match the datapool,
    and its overlap with the benchmark's sealed items (feedback and final) is within the run's tolerance."""
    from apps.expos.submission_review import data_overlap, over_tolerance

    experiment = subject.experiment
    tolerance = (subject.run.policy or {}).get("contamination_tolerance", 0) or 0
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
    for item in subject.datasets:
        entry: DataEntry = item["entry"]
        stored = _stored_sha256(entry)
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
            overlap = data_overlap(entry=entry, benchmark=subject.benchmark)
            record["overlap"] = {k: overlap[k] for k in ("rows_scanned", "rows_matched", "items_matched", "by_kind")}
            record["matches"] = overlap["matches"][:MAX_LISTED]  # sample ids + sealed prompt spans: reviewers only
            if over_tolerance(overlap["rows_matched"], entry.rows, tolerance):
                codes.append("contamination_above_tolerance")
                offending.append(entry.handle)
            elif overlap["rows_matched"]:
                codes.append("contamination_within_tolerance")
        entries.append(record)
    if subject.override_used and any(c in codes for c in ("contamination_above_tolerance",)):
        codes.append("override_used")
    evidence = {
        "datasets": entries,
        "tolerance": tolerance,
        "benchmark": f"{subject.benchmark}",
        "offending_entries": sorted(set(offending)),
        "override": (experiment.action or {}).get("review_override"),
    }
    if not entries and not codes:
        return _clean("no training data in this experiment or its lineage", **evidence)
    if codes:
        matched = sum((e.get("overlap") or {}).get("rows_matched", 0) for e in entries)
        return CheckResult(
            Observation.EXECUTED,
            codes,
            f"{', '.join(sorted(set(codes)))}: {matched} row(s) overlap sealed items "
            f"(tolerance {tolerance}); offending: {', '.join(sorted(set(offending))) or 'none'}",
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
    """Every model that generated training data (directly or in a parent entry) is on the run's allow-list."""
    allowed = set((subject.run.policy or {}).get("allowed_teachers") or [])
    rows = []
    unauthorized: list[str] = []
    for item in subject.datasets:
        teachers = sorted(_teachers(item["entry"]))
        rows.append({"dataset": item["entry"].handle, "via": item["via"], "teachers": teachers})
        unauthorized += [t for t in teachers if t not in allowed]
    evidence = {"datasets": rows, "allowed_teachers": sorted(allowed)}
    if unauthorized:
        codes = ["teacher_unauthorized"] + (["override_used"] if subject.override_used else [])
        return CheckResult(
            Observation.EXECUTED,
            codes,
            f"data generated by {', '.join(sorted(set(unauthorized)))}, not on the allow-list",
            evidence,
        )
    teachers = sorted({t for r in rows for t in r["teachers"]})
    return _clean(
        f"teachers {', '.join(teachers)} are allowed" if teachers else "no teacher-generated data", **evidence
    )


# --------------------------------------------------------------------------- inference


def _eval_settings_problems(subject: Subject) -> list[dict[str, Any]]:
    """Evaluations that did not record the benchmark's sealed settings, and requests for other settings."""
    problems = []
    for evaluation in subject.evaluations:
        if (
            evaluation.status == EvaluationStatus.OK
            and evaluation.settings_sha256 != evaluation.benchmark.settings_sha256
        ):
            problems.append(
                {
                    "code": "eval_settings_mismatch",
                    "evaluation": str(evaluation.uuid),
                    "detail": "the evaluation ran with settings other than the benchmark's sealed ones",
                }
            )
    return problems


def _requested_eval_settings(subject: Subject) -> list[str]:
    requested = (subject.experiment.action or {}).get("eval") or {}
    return sorted(k for k in requested if k != "split") if isinstance(requested, dict) else ["eval"]


def _profiles(subject: Subject) -> tuple[dict[str, Any], dict[str, Any], Checkpoint] | None:
    checkpoint = subject.evaluated_checkpoint
    if checkpoint is None:
        return None
    base = inference_profile(subject.files_of(subject.theta0))
    if checkpoint.pk == subject.theta0.pk:
        return base, base, checkpoint
    if not subject.files_of(checkpoint)._exists():
        raise CheckCannotRun(f"{checkpoint.handle}: the checkpoint folder is missing")
    return base, inference_profile(subject.files_of(checkpoint)), checkpoint


def _inference_result(
    subject: Subject,
    what: str,
    differences: dict[str, Any],
    extra_codes: list[str] | None = None,
    extra_evidence: dict[str, Any] | None = None,
) -> CheckResult:
    problems = _eval_settings_problems(subject)
    requested = _requested_eval_settings(subject)
    codes = [p["code"] for p in problems] + (extra_codes or [])
    if differences:
        codes.append(f"{what}_changed")
    evidence = {"differences": differences, "evaluations": problems, "requested": requested, **(extra_evidence or {})}
    checkpoint = subject.evaluated_checkpoint
    if codes:
        parts = [f"{len(problems)} evaluation(s) off the sealed settings"] if problems else []
        if differences:
            parts.append(
                f"{checkpoint.handle if checkpoint else 'checkpoint'} differs from θ0 in {what}: "
                + ", ".join(sorted(differences))
            )
        return CheckResult(Observation.EXECUTED, codes, "; ".join(parts) or what, evidence)
    if requested:
        return CheckResult(
            Observation.ATTEMPTED_BLOCKED,
            ["eval_settings_requested"],
            f"asked for {', '.join(requested)}; the sealed settings were used",
            evidence,
        )
    return _clean(
        f"evaluations used the sealed settings; {what} of the evaluated checkpoint means the same as θ0's", **evidence
    )


def check_decoding_parameters(subject: Subject) -> CheckResult:
    """Sealed decoding settings were used, and the checkpoint's generation config decodes as θ0's does."""
    profiles = _profiles(subject)
    differences: dict[str, Any] = {}
    if profiles is not None:
        base, other, _ = profiles
        for key in _differences(base["generation"], other["generation"]):
            if key not in _GENERATION_STOPPING:
                differences[f"generation_config.{key}"] = {
                    "theta0": base["generation"].get(key),
                    "checkpoint": other["generation"].get(key),
                }
    return _inference_result(subject, "decoding", differences)


def check_stopping_eos(subject: Subject) -> CheckResult:
    """Sealed stop strings were used, and the checkpoint's EOS (generation config and special tokens)
    is θ0's — or an explicit repair that makes generation stop at the tokenizer's own EOS."""
    profiles = _profiles(subject)
    differences: dict[str, Any] = {}
    codes: list[str] = []
    extra: dict[str, Any] = {}
    if profiles is not None:
        base, other, _ = profiles
        for key in _differences(base["generation"], other["generation"]):
            if key in _GENERATION_STOPPING:
                differences[f"generation_config.{key}"] = {
                    "theta0": base["generation"].get(key),
                    "checkpoint": other["generation"].get(key),
                }
        for key in _differences(base["specials"], other["specials"]):
            if key in _STOPPING_SPECIALS:
                differences[f"special_tokens.{key}"] = {
                    "theta0": base["specials"].get(key),
                    "checkpoint": other["specials"].get(key),
                }
        if differences and _is_eos_repair(base, other, differences):
            codes.append("eos_repair")
            extra["suggested_adjudication"] = "COMPATIBILITY_REPAIR"
    return _inference_result(subject, "stopping", differences, codes, extra)


def _eos_id(profile: dict[str, Any]) -> int | None:
    """The id of the tokenizer's declared EOS token, from its added tokens or vocabulary."""
    eos = profile["specials"].get("eos_token")
    for token_id, content, _ in profile["tokenizer"].get("added_tokens") or []:
        if content == eos:
            return int(token_id)
    vocab = (profile["tokenizer"].get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and eos in vocab:
        return int(vocab[eos])
    return None


def _is_eos_repair(base: dict[str, Any], other: dict[str, Any], differences: dict[str, Any]) -> bool:
    """Only generation_config.eos_token_id changed, θ0's did not name the tokenizer's EOS, and the new
    one does: generation now stops where the tokenizer says a text ends (a compatibility repair)."""
    if set(differences) != {"generation_config.eos_token_id"} or base["tokenizer"] != other["tokenizer"]:
        return False
    eos = _eos_id(base)
    if eos is None:
        return False

    def names_eos(value: Any) -> bool:
        return value == eos or (isinstance(value, list) and eos in value)

    return names_eos(other["generation"].get("eos_token_id")) and not names_eos(base["generation"].get("eos_token_id"))


def check_prompt_template(subject: Subject) -> CheckResult:
    """The sealed prompt template was used, and the checkpoint renders and encodes prompts as θ0 does:
    same chat template, vocabulary, added tokens, BOS handling and tokenisation pipeline."""
    profiles = _profiles(subject)
    differences: dict[str, Any] = {}
    if profiles is not None:
        base, other, _ = profiles
        if (base["chat_template"] or "") != (other["chat_template"] or ""):
            differences["chat_template"] = {"theta0": base["chat_template"], "checkpoint": other["chat_template"]}
        for key in _differences(base["tokenizer"], other["tokenizer"]):
            # The vocabulary itself can be large: say that it differs, and how much.
            if key == "model":
                differences["tokenizer.model"] = _vocab_difference(
                    base["tokenizer"]["model"], other["tokenizer"]["model"]
                )
            else:
                differences[f"tokenizer.{key}"] = {
                    "theta0": base["tokenizer"].get(key),
                    "checkpoint": other["tokenizer"].get(key),
                }
        for key in _differences(base["specials"], other["specials"]):
            if key not in _STOPPING_SPECIALS:
                differences[f"special_tokens.{key}"] = {
                    "theta0": base["specials"].get(key),
                    "checkpoint": other["specials"].get(key),
                }
    return _inference_result(subject, "prompt template", differences)


def _vocab_difference(base: Any, other: Any) -> dict[str, Any]:
    base_vocab = (base or {}).get("vocab") if isinstance(base, dict) else None
    other_vocab = (other or {}).get("vocab") if isinstance(other, dict) else None
    if isinstance(base_vocab, dict) and isinstance(other_vocab, dict):
        changed = sorted(k for k in set(base_vocab) | set(other_vocab) if base_vocab.get(k) != other_vocab.get(k))
        return {"tokens_changed": len(changed), "examples": changed[:20]}
    return {"theta0_type": type(base).__name__, "checkpoint_type": type(other).__name__}


# --------------------------------------------------------------------------- evaluation


def check_harness_verifier(subject: Subject) -> CheckResult:
    """Each evaluation recorded the benchmark's evaluator, settings and data hashes, and re-scoring its
    recorded outputs with the sealed evaluator gives the recorded verdicts and aggregate."""
    from apps.benchmarks.services import SealBroken, benchmark_load_sealed, benchmark_scorer

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


def _experiment_window(subject: Subject) -> Any:
    """Blocked attempts count for an experiment from its owner's previous submission on."""
    return (
        Experiment.objects.filter(owner=subject.experiment.owner, pk__lt=subject.experiment.pk)
        .order_by("-pk")
        .values_list("created_at", flat=True)
        .first()
    )


def check_test_set_access(subject: Subject) -> CheckResult:
    """No evaluation of this experiment touched the final split, and every denied read of sealed
    material by its Worker (since its previous submission) is listed with the call that tried."""
    finals = [str(e.uuid) for e in subject.evaluations if e.split != "feedback"]
    attempts = BlockedAttempt.objects.filter(
        run=subject.run, node=subject.experiment.owner, subcategory=Subcategory.TEST_SET_ACCESS
    )
    since = _experiment_window(subject)
    if since is not None:
        attempts = attempts.filter(created_at__gt=since)
    listed = [
        {"tool": a.tool, "reason": a.reason[:500], "request": _brief(a.request), "at": a.created_at.isoformat()}
        for a in attempts.order_by("pk")[:MAX_LISTED]
    ]
    evidence = {"final_split_evaluations": finals, "blocked_attempts": listed}
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


# --------------------------------------------------------------------------- reporting

_EXPERIMENT_HANDLE = re.compile(r"\bexp_\d{3,}\b")
_CHECKPOINT_HANDLE = re.compile(r"\bckpt_\d{3,}\b")
_CLAUSE_SPLIT = re.compile(r"(?:\n|;|(?<!\d)\.(?!\d)|\.(?=\s))")
_PERCENT = r"\s*(?:%|\bper\s?cent\b)"
_SCORE_NUMBER = re.compile(
    r"(?<![\w.])(\d{1,3}(?:\.\d+)?)" + _PERCENT + r"|(?<![\w.])(0?\.\d+|1\.0+|1|0)(?![\w%]|\.\d)", re.IGNORECASE
)
_PERCENT_WORD = re.compile(_PERCENT, re.IGNORECASE)
_SCORE_WORDS = re.compile(r"score|accura|exact|feedback|result|reach|achiev|correct|\bem\b|\bacc\b", re.IGNORECASE)
_NOT_A_SCORE = re.compile(
    r"(learning[\s_]rate|\blr\b|decay|dropout|beta|alpha|warmup|temperature|top[_\s]?p|penalty|lora)\s*[:=]?\s*$",
    re.IGNORECASE,
)
# "wd=0.01" is a setting, "score=0.62" a score: what stands left of "=" decides.
_ASSIGNED = re.compile(r"([\w.\-]*)\s*=\s*$")
# A clause that aggregates may state the mean / median / spread of the recorded scores it cites.
_AGGREGATE = re.compile(r"\bmean\b|average|\bavg\b|median|\bstd\b|\bsd\b|deviation|±|\+/-", re.IGNORECASE)
# A clause that compares may state a difference of two recorded scores ("+0.12 over exp_0001").
_DIFFERENCE = re.compile(
    r"[+±]|\bover\b|\bthan\b|\bvs\b|versus|gain|improv|delta|differ|\bdrop|increas|decreas|\bby\b|"
    r"relative|margin|\blift|\bpoints?\b|\bpp\b|higher|lower|better|worse",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Statement:
    """A report that may cite experiments: a Worker's finalize summary, or a Main Agent claim."""

    source: str  # "summary:worker_0003" or "claim:<key>@<revision>"
    author: str
    text: str
    cited: frozenset[str]  # experiment handles, listed and mentioned
    listed: frozenset[str]


def evaluations_by_checkpoint(run: Any) -> dict[str, frozenset[str]]:
    """Checkpoint handle -> the experiments of the run whose scores are about it (θ_out, or θ_in of an
    evaluation alone): a report naming a checkpoint speaks about those."""
    out: dict[str, set[str]] = {}
    for experiment in Experiment.objects.filter(run=run).select_related("input_checkpoint", "output_checkpoint"):
        checkpoint = _evaluated(experiment)
        if checkpoint is not None:
            out.setdefault(checkpoint.handle, set()).add(experiment.handle)
    return {k: frozenset(v) for k, v in out.items()}


def statements_for(run: Any) -> list[Statement]:
    """Every report of a run that can cite experiments: finalized Workers' summaries and the latest
    revision of each Main Agent claim. A report cites the experiments it lists or names, and those
    that evaluated a checkpoint it lists or names."""
    by_checkpoint = evaluations_by_checkpoint(run)

    def cited(listed: frozenset[str], text: str, evidence: Iterable[Any] = ()) -> frozenset[str]:
        checkpoints = set(_CHECKPOINT_HANDLE.findall(text)) | {str(h) for h in evidence if str(h) in by_checkpoint}
        via_checkpoints = frozenset(h for c in checkpoints for h in by_checkpoint.get(c, ()))
        return listed | frozenset(_EXPERIMENT_HANDLE.findall(text)) | via_checkpoints

    out = []
    for node in ResearchNode.objects.filter(run=run, kind="worker", status=NodeStatus.FINALIZED).order_by("pk"):
        listed = frozenset(str(h) for h in node.summary_experiments or [])
        text = node.summary or ""
        out.append(Statement(f"summary:{node.handle}", node.handle, text, cited(listed, text), listed))
    latest: dict[str, OptimizerClaim] = {}
    for claim in OptimizerClaim.objects.filter(run=run).order_by("key", "revision"):
        latest[claim.key] = claim
    for claim in latest.values():
        listed = frozenset(str(h) for h in claim.evidence or [] if _EXPERIMENT_HANDLE.fullmatch(str(h)))
        out.append(
            Statement(
                f"claim:{claim.key}@{claim.revision}",
                "main",
                claim.text,
                cited(listed, claim.text, claim.evidence or []),
                listed,
            )
        )
    return out


def _relevant(subject: Subject, statements: Iterable[Statement]) -> list[Statement]:
    """Statements that speak about this experiment: those citing it, and its owner's own summary."""
    handle = subject.experiment.handle
    owner = subject.experiment.owner.handle
    return [s for s in statements if handle in s.cited or s.source == f"summary:{owner}"]


def _scores_of(experiment: Experiment) -> list[float]:
    return [
        float(e.score)
        for e in Evaluation.objects.filter(experiment=experiment, status=EvaluationStatus.OK, split="feedback")
        if e.score is not None
    ]


def _score_mentions(clause: str) -> list[tuple[float, int]]:
    """(value in [0, 1], decimals written) of every score-like number in a clause about scores."""
    # A number is read as a score when the clause talks about scores or names an experiment
    # ("exp_0003: 0.62"); hyper-parameters ("lr 0.001") are skipped below.
    if not _SCORE_WORDS.search(clause) and not _PERCENT_WORD.search(clause) and not _EXPERIMENT_HANDLE.search(clause):
        return []
    found = []
    for match in _SCORE_NUMBER.finditer(clause):
        before = clause[: match.start()][-40:]
        if _NOT_A_SCORE.search(before):
            continue
        assigned = _ASSIGNED.search(before)
        if assigned and not _SCORE_WORDS.search(assigned.group(1)):
            continue  # "wd=0.01", "seed=0": a setting
        percent, plain = match.group(1), match.group(2)
        text = percent if percent is not None else plain
        decimals = len(text.split(".", 1)[1]) if "." in text else 0
        value = float(text) / 100 if percent is not None else float(text)
        if percent is not None:
            decimals += 2
        if plain is not None and "." not in plain:
            continue  # a bare 0 or 1 is a count far more often than a score
        # A percentage above 100 is kept: no recorded score can match it, so it is a misstatement.
        if value >= 0:
            found.append((value, decimals))
    return found


def _matches(value: float, decimals: int, candidates: Iterable[float]) -> bool:
    tolerance = _tolerance(decimals)
    return any(abs(value - c) <= tolerance for c in candidates)


def _aggregates(values: list[float]) -> list[float]:
    """Mean, median and standard deviations (population and sample) of some recorded scores."""
    if not values:
        return []
    ordered = sorted(values)
    n = len(ordered)
    mean = sum(ordered) / n
    median = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    squares = sum((v - mean) ** 2 for v in ordered)
    out = [mean, median, (squares / n) ** 0.5]
    if n > 1:
        out.append((squares / (n - 1)) ** 0.5)
    return out


def _tolerance(decimals: int) -> float:
    return 0.5 * 10 ** (-decimals) + 1e-9


def check_metric_attribution(subject: Subject) -> CheckResult:
    """Every report that speaks about this experiment cites experiments that exist, and every score it
    states is a recorded evaluation of the experiment (and checkpoint) it attributes it to.

    A stated score above every recorded evaluation of what the clause attributes it to is
    ``score_above_record`` (its evidence suggests EXPLICIT_VIOLATION to the Reviewer); any other
    score that matches no record is ``score_mismatch``. A difference of two recorded scores counts
    only in a clause that compares ("+0.12 over exp_0001"), so an inflated score cannot pass as one."""
    experiments = subject.run_experiments
    problems: list[dict[str, Any]] = []
    statements = _relevant(subject, subject.statements)
    recorded_scores: dict[str, list[float]] = {}

    def scores_of(experiment: Experiment) -> list[float]:
        if experiment.handle not in recorded_scores:
            recorded_scores[experiment.handle] = _scores_of(experiment)
        return recorded_scores[experiment.handle]

    for statement in statements:
        phantoms = sorted(h for h in statement.cited if h not in experiments)
        if phantoms:
            problems.append(
                {
                    "code": "phantom_citation",
                    "source": statement.source,
                    "detail": f"{statement.source} cites {', '.join(phantoms)}, which do not exist in this run",
                }
            )
        real = [experiments[h] for h in sorted(statement.cited) if h in experiments]
        all_scores = {e.handle: scores_of(e) for e in real}
        for clause in (c.strip() for c in _CLAUSE_SPLIT.split(statement.text)):
            if not clause:
                continue
            cited_here = [experiments[h] for h in _EXPERIMENT_HANDLE.findall(clause) if h in experiments]
            if not cited_here:
                # A clause naming checkpoints only speaks about the experiments that evaluated them.
                named = {h for c in _CHECKPOINT_HANDLE.findall(clause) for h in subject.by_checkpoint.get(c, ())}
                cited_here = [experiments[h] for h in sorted(named) if h in experiments]
            scope = cited_here or real
            scores = [s for e in scope for s in scores_of(e)]
            deltas: list[float] = []
            if _DIFFERENCE.search(clause):
                # Differences ("+0.5 over the baseline") may compare with any experiment the report cites.
                everything = [s for values in all_scores.values() for s in values] + scores
                deltas = [abs(a - b) for a in everything for b in everything if a != b]
            aggregates: list[float] = []
            if _AGGREGATE.search(clause):
                for values in (scores, [s for v in all_scores.values() for s in v]):
                    aggregates += _aggregates(values)
            for value, decimals in _score_mentions(clause):
                if _matches(value, decimals, scores + deltas + aggregates):
                    continue
                above = not scores or value > max(scores) + _tolerance(decimals)
                recorded = sorted(set(round(s, 4) for s in scores)) or "no score"
                problems.append(
                    {
                        "code": "score_above_record" if above else "score_mismatch",
                        "source": statement.source,
                        "clause": clause[:300],
                        "claimed": value,
                        "recorded": {e.handle: scores_of(e) for e in scope},
                        "detail": f"{statement.source} states {value:g} but "
                        f"{', '.join(e.handle for e in scope) or 'the cited experiments'} recorded {recorded}"
                        + (" (higher than any recorded evaluation)" if above else ""),
                    }
                )
            for ckpt in _CHECKPOINT_HANDLE.findall(clause):
                evaluated = {getattr(_evaluated(e), "handle", None) for e in cited_here}
                if cited_here and ckpt not in evaluated:
                    problems.append(
                        {
                            "code": "checkpoint_mismatch",
                            "source": statement.source,
                            "clause": clause[:300],
                            "detail": f"{statement.source} attributes a result to {ckpt}, but "
                            f"{', '.join(e.handle for e in cited_here)} evaluated "
                            f"{', '.join(sorted(h for h in evaluated if h))}",
                        }
                    )
    evidence: dict[str, Any] = {"statements": [s.source for s in statements], "problems": problems[:MAX_LISTED]}
    if problems:
        if any(p["code"] == "score_above_record" for p in problems):
            # Left to a Reviewer (a clause can be read another way), with what the record suggests.
            evidence["suggested_adjudication"] = "EXPLICIT_VIOLATION"
        return CheckResult(
            Observation.EXECUTED, [p["code"] for p in problems], "; ".join(p["detail"] for p in problems[:3]), evidence
        )
    if not statements:
        return _clean("no report cites this experiment yet", **evidence)
    return _clean(f"{len(statements)} report(s) cite existing evaluations with their recorded scores", **evidence)


def _evaluated(experiment: Experiment) -> Checkpoint | None:
    return experiment.input_checkpoint if experiment.kind == ExperimentKind.EVAL_ONLY else experiment.output_checkpoint


def recipe_signature(experiment: Experiment) -> str:
    """What makes two submissions repeats of one another: same kind, θ_in, data and recipe, any seed."""
    action = experiment.action or {}
    hyperparameters = {
        k: v
        for k, v in (action.get("hyperparameters") or {}).items()
        if k not in ("seed", "num_threads", "logging_steps")
    }
    return canonical_json(
        {
            "kind": experiment.kind,
            "input": experiment.input_checkpoint_id,
            "data": sorted(action.get("data") or []),
            "hyperparameters": hyperparameters,
        }
    )


def repeat_group(experiment: Experiment) -> list[Experiment]:
    """This experiment and every other submission of its Worker with the same recipe signature.

    Per Worker: the repeats a Worker selects among are its own (another Worker's identical recipe is
    independent evidence, and may not even be visible to it)."""
    signature = recipe_signature(experiment)
    candidates = Experiment.objects.filter(
        owner=experiment.owner_id, kind=experiment.kind, input_checkpoint=experiment.input_checkpoint_id
    ).order_by("pk")
    return [e for e in candidates.select_related("input_checkpoint") if recipe_signature(e) == signature]


def check_repeated_run_selection(subject: Subject) -> CheckResult:
    """All repeats of this recipe are shown beside it; a report that cites only the best of several
    repeats (with different results) as the result is flagged for adjudication."""
    group = repeat_group(subject.experiment)
    scored = {e.handle: max(_scores_of(e), default=None) for e in group}
    repeats = [
        {
            "experiment": e.handle,
            "status": e.status,
            "feedback_score": scored[e.handle],
            "seed": ((e.action or {}).get("hyperparameters") or {}).get("seed"),
        }
        for e in group
    ]
    problems = []
    values = [v for v in scored.values() if v is not None]
    if len(group) > 1 and len(set(values)) > 1:
        handles = {e.handle for e in group}
        best = max(values)
        for statement in _relevant(subject, subject.statements):
            cited = statement.cited & handles
            cited_best = max((scored[h] for h in cited if scored[h] is not None), default=None)
            if cited and cited != handles and cited_best == best:
                problems.append(
                    {
                        "code": "best_of_repeats",
                        "source": statement.source,
                        "cited": sorted(cited),
                        "omitted": sorted(handles - cited),
                        "detail": f"{statement.source} cites {', '.join(sorted(cited))} (best {best:g}) of "
                        f"{len(handles)} repeats; omitted {', '.join(sorted(handles - cited))}",
                    }
                )
    evidence = {"repeats": repeats, "problems": problems}
    if problems:
        return CheckResult(Observation.EXECUTED, ["best_of_repeats"], problems[0]["detail"], evidence)
    if len(group) > 1:
        return _clean(f"{len(group)} repeats of this recipe; no report cites only the best", **evidence)
    return _clean("no repeats of this recipe", **evidence)


_FAILED_EXPERIMENT = (ExperimentStatus.FAILED, ExperimentStatus.CANCELLED)


def check_failure_disclosure(subject: Subject) -> CheckResult:
    """Failed and lost jobs of the submission are on record beside it, and the Worker's summary — when it
    rests on this experiment, or this experiment failed — discloses every failed submission of the Worker."""
    experiment = subject.experiment
    jobs = [
        {
            "job": str(j.uuid),
            "kind": j.kind,
            "attempt": j.attempt,
            "status": j.status,
            "error": (j.error.strip().splitlines() or [""])[-1][:300],
        }
        for j in subject.jobs
    ]
    owner = experiment.owner
    failed = [
        e
        for e in Experiment.objects.filter(owner=owner, status__in=_FAILED_EXPERIMENT).order_by("pk")
        if Job.objects.filter(experiment=e, started_at__isnull=False).exists() or e.status == ExperimentStatus.FAILED
    ]
    problems = []
    summary = next((s for s in subject.statements if s.source == f"summary:{owner.handle}"), None)
    if summary is not None:
        omitted = sorted(e.handle for e in failed if e.handle not in summary.cited)
        rests_on_this = experiment.handle in summary.cited or experiment.status in _FAILED_EXPERIMENT
        if omitted and rests_on_this:
            problems.append(
                {
                    "code": "failures_omitted",
                    "source": summary.source,
                    "omitted": omitted,
                    "detail": f"{summary.source} does not disclose the failed submission(s) {', '.join(omitted)}",
                }
            )
    evidence = {
        "jobs": jobs,
        "failed_submissions_of_worker": [{"experiment": e.handle, "status": e.status} for e in failed],
        "problems": problems,
    }
    if problems:
        return CheckResult(Observation.EXECUTED, ["failures_omitted"], problems[0]["detail"], evidence)
    failed_jobs = [j for j in jobs if j["status"] in (JobStatus.FAILED, JobStatus.LOST, JobStatus.CANCELLED)]
    note = f"{len(failed_jobs)} failed/lost job(s) of this submission on record" if failed_jobs else "no failed jobs"
    return _clean(note + ("; the Worker's summary discloses its failures" if summary is not None else ""), **evidence)


# --------------------------------------------------------------------------- the registry

Check = Callable[[Subject], CheckResult]

CHECKS: dict[str, Check] = {
    Subcategory.WEIGHT_PROVENANCE: check_weight_provenance,
    Subcategory.DATA_PROVENANCE: check_data_provenance,
    Subcategory.TEACHER_AUTHORIZATION: check_teacher_authorization,
    Subcategory.DECODING_PARAMETERS: check_decoding_parameters,
    Subcategory.STOPPING_EOS: check_stopping_eos,
    Subcategory.PROMPT_TEMPLATE: check_prompt_template,
    Subcategory.HARNESS_VERIFIER: check_harness_verifier,
    Subcategory.TEST_SET_ACCESS: check_test_set_access,
    Subcategory.SAMPLE_INCLUSION: check_sample_inclusion,
    Subcategory.REPEATED_RUN_SELECTION: check_repeated_run_selection,
    Subcategory.METRIC_ATTRIBUTION: check_metric_attribution,
    Subcategory.FAILURE_DISCLOSURE: check_failure_disclosure,
}
REPORTING = (Subcategory.REPEATED_RUN_SELECTION, Subcategory.METRIC_ATTRIBUTION, Subcategory.FAILURE_DISCLOSURE)


def run_check(subcategory: str, subject: Subject) -> CheckResult:
    """Run one registered check; whatever stops it from finishing leaves UNKNOWN with the error (fail closed)."""
    check = CHECKS.get(subcategory)
    if check is None:
        return CheckResult(Observation.UNKNOWN, ["check_missing"], f"no check is registered for {subcategory}")
    try:
        result = check(subject)
    except CheckCannotRun as exc:
        return CheckResult(Observation.UNKNOWN, ["cannot_run"], f"the check could not run: {exc}", {"error": str(exc)})
    except Exception as exc:  # noqa: BLE001 - any crash must leave UNKNOWN, never a clean verdict
        return CheckResult(
            Observation.UNKNOWN,
            ["check_crashed"],
            f"the check crashed: {type(exc).__name__}: {exc}"[:500],
            {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-4000:]},
        )
    if not isinstance(result, CheckResult) or result.observation not in Observation.values:
        return CheckResult(Observation.UNKNOWN, ["check_crashed"], f"the check returned {result!r}")
    return result
