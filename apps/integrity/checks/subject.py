"""What the checks read and return: one experiment's records (:class:`Subject`), its checkpoint files,
and :class:`CheckResult`. Checks never write; a check that cannot read what it must raises
:class:`CheckCannotRun` (the subcategory stays UNKNOWN)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import fsspec

from apps.benchmarks.models import Benchmark
from apps.core.errors import ApplicationError
from apps.core.hashing import canonical_json
from apps.datapool.models import DataEntry, DataUsage
from apps.datapool.storage import artifact_store
from apps.experiments.choices import ExperimentKind, ExperimentStatus
from apps.experiments.models import Checkpoint, Evaluation, Experiment
from apps.experiments.selectors import checkpoint_lineage
from apps.integrity.choices import Observation
from apps.integrity.claims import handles_in
from apps.jobs.choices import JobKind
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


class CheckpointFiles:
    """The files of a registered checkpoint, read where its URI points: the artifact store (any
    fsspec URL, read directly rather than through a local cache, so a changed file is seen) or a
    ``file://`` folder (θ0 installed from a minibench folder, sealed references)."""

    def __init__(self, checkpoint: Checkpoint) -> None:
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
        return evaluated_checkpoint(self.experiment)

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


# What a run's reports cite: the reporting checks read these through ``Subject.statements``.

_EXPERIMENT_HANDLE = re.compile(r"\bexp_\d{3,}\b")


def evaluated_checkpoint(experiment: Experiment) -> Checkpoint | None:
    """The checkpoint an experiment's scores are about: θ_out, or θ_in for an evaluation alone."""
    return experiment.input_checkpoint if experiment.kind == ExperimentKind.EVAL_ONLY else experiment.output_checkpoint


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
        checkpoint = evaluated_checkpoint(experiment)
        if checkpoint is not None:
            out.setdefault(checkpoint.handle, set()).add(experiment.handle)
    return {k: frozenset(v) for k, v in out.items()}


def statements_for(run: Any) -> list[Statement]:
    """Every report of a run that can cite experiments: finalized Workers' summaries and the latest
    revision of each Main Agent claim. A report cites the experiments it lists or names, and those
    that evaluated a checkpoint it lists or names."""
    by_checkpoint = evaluations_by_checkpoint(run)

    def cited(listed: frozenset[str], text: str, evidence: Iterable[Any] = ()) -> frozenset[str]:
        # Handles as the claim reader reads them: in any script, any case, any separator.
        named, named_checkpoints = handles_in(text)
        checkpoints = set(named_checkpoints) | {str(h) for h in evidence if str(h) in by_checkpoint}
        via_checkpoints = frozenset(h for c in checkpoints for h in by_checkpoint.get(c, ()))
        return listed | named | via_checkpoints

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
