"""Teacher detection: does registered training data agree with a model's greedy outputs beyond correctness?

Data distilled from a model carries that model's fingerprints: its wrong answers, copied exactly,
and the artefacts of its decoding. Correct data agrees with any good model on the items that model
gets right, so agreement alone is no evidence; this module measures agreement only where
correctness cannot explain it:

- **wrong answers**: rows whose prompt has a curated label (a completion of a datapool entry
  registered from the catalog whose card vouches for its labels, other than the entry under test)
  that the candidate's output does not match under the benchmark's evaluator — the candidate gets
  that item wrong. Honest data gives the label there, not the candidate's answer.
- **quirks**: rows where the candidate's greedy output is a decoding artefact — cut by the token
  budget (as many tokens as ``max_new_tokens``) or empty. An honest completion has no reason to
  end exactly where the candidate's budget ran out.

On those rows, the share whose completion equals the candidate's output exactly is the agreement.

Candidates (:func:`teacher_candidates`) are the benchmark's reference checkpoint and every other
registered root checkpoint not on θ0's lineage (bases of other benchmarks, checkpoints not made by
a recorded job), at most :data:`MAX_TEACHERS`. Outputs come from the project's inference code
(:func:`apps.ml.inference.generate_texts`, greedy, under the benchmark's decoding and stop
settings) on a bounded sample of rows (:data:`MAX_TEACHER_ROWS`, labelled rows first, then a
fixed hash order), so the check stays fast on CPU; they are cached in the artifact store per
(dataset sha256, checkpoint manifest, sample), written once and never replaced.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Q

from apps.benchmarks.services import benchmark_scorer, checkpoint_local_dir
from apps.core.errors import ApplicationError
from apps.core.hashing import canonical_json
from apps.datapool.models import DataEntry, DataFormat, SourceKind
from apps.datapool.services import data_load_rows
from apps.datapool.storage import artifact_store
from apps.experiments.models import Checkpoint
from apps.experiments.selectors import checkpoint_lineage

# The bounded sample of one dataset compared with each candidate (documented in docs/run-policy.md).
MAX_TEACHER_ROWS = 64
# How many candidate teachers are compared: the benchmark's reference first, then other roots.
MAX_TEACHERS = 4
# Fewer telling rows (wrong answers + quirks) than this is too little evidence to say anything.
MIN_EVIDENCE_ROWS = 8
# The share of telling rows agreeing exactly above which a candidate is reported (the run
# policy's ``teacher_agreement_threshold`` overrides it).
DEFAULT_THRESHOLD = 0.5
# Bumped when what is cached changes meaning, so an old cache entry is not read as a new one.
CACHE_VERSION = 1


@dataclass
class Agreement:
    """One (dataset, candidate) comparison."""

    dataset: str
    teacher: str  # the candidate checkpoint's handle
    rows_compared: int = 0
    exact_agreement: int = 0  # rows whose completion equals the candidate's output (any row)
    wrong_rows: int = 0  # rows the candidate gets wrong (against a curated label)
    wrong_agreement: int = 0  # ... whose completion copies the candidate's wrong output
    quirk_rows: int = 0  # rows whose candidate output is a decoding artefact
    quirk_agreement: int = 0
    examples: list[dict[str, str]] = field(default_factory=list)  # a few copied wrong answers / quirks

    @property
    def telling_rows(self) -> int:
        return self.wrong_rows + self.quirk_rows

    @property
    def telling_agreement(self) -> int:
        return self.wrong_agreement + self.quirk_agreement

    def share(self) -> float:
        return self.telling_agreement / self.telling_rows if self.telling_rows else 0.0

    def high(self, threshold: float) -> bool:
        return self.telling_rows >= MIN_EVIDENCE_ROWS and self.share() >= threshold

    def record(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "teacher": self.teacher,
            "rows_compared": self.rows_compared,
            "exact_agreement": self.exact_agreement,
            "wrong_rows": self.wrong_rows,
            "wrong_agreement": self.wrong_agreement,
            "quirk_rows": self.quirk_rows,
            "quirk_agreement": self.quirk_agreement,
            "telling_share": round(self.share(), 4),
            "examples": self.examples,
        }


class TeacherUnavailable(Exception):  # noqa: N818 - an outcome recorded in the evidence
    """A candidate checkpoint cannot be run as a model (its files are missing or not weights)."""


def teacher_candidates(*, benchmark: Any, theta0: Checkpoint) -> list[Checkpoint]:
    """The benchmark's reference, then other root checkpoints not on θ0's lineage (newest first)."""
    found: list[Checkpoint] = []
    # Weights identical to θ0's (the same manifest) are θ0 as far as any output can tell.
    seen = {theta0.manifest_sha256}
    if benchmark.reference_checkpoint_id is not None and benchmark.reference_checkpoint.manifest_sha256 not in seen:
        found.append(benchmark.reference_checkpoint)
        seen.add(benchmark.reference_checkpoint.manifest_sha256)
    roots = (
        Checkpoint.objects.filter(Q(is_reference=True) | Q(is_base=True) | Q(producing_job__isnull=True))
        .exclude(pk=theta0.pk)
        .order_by("-created_at", "-pk")
    )
    for checkpoint in roots[: MAX_TEACHERS * 4]:
        if len(found) >= MAX_TEACHERS:
            break
        if checkpoint.manifest_sha256 in seen:
            continue  # θ0's weights again, or a copy of a candidate already listed
        if checkpoint_lineage(checkpoint, base=theta0).reaches_base:
            continue  # descended from θ0 after all
        found.append(checkpoint)
        seen.add(checkpoint.manifest_sha256)
    return found[:MAX_TEACHERS]


# Catalog datasets whose own card declares their labels unreliable: never taken as truth.
UNRELIABLE_LABELS = frozenset({"noisy", "wrong_format"})


def _catalog_quality(entry: DataEntry) -> str | None:
    """The catalog's declared quality of an entry registered from it (meta.json), or None if unreadable."""
    name = (entry.source or {}).get("catalog")
    root = getattr(settings, "MINIBENCH_ROOT", "")
    if not isinstance(name, str) or not root:
        return None
    try:
        meta = json.loads((Path(root) / "catalog" / name / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    quality = meta.get("quality") if isinstance(meta, dict) else None
    return quality if isinstance(quality, str) else None


def catalog_labels(*, exclude: DataEntry) -> dict[str, set[str]]:
    """prompt -> completions of the SFT entries registered from the catalog (curated labels).

    Only catalog datasets whose card vouches for their labels count (not ``noisy`` or
    ``wrong_format``, and not one whose card cannot be read); the entry under test never labels
    itself. A prompt whose trusted sources disagree gets all their answers (the candidate is then
    wrong only when it matches none).
    """
    labels: dict[str, set[str]] = {}
    entries = DataEntry.objects.filter(source_kind=SourceKind.CATALOG, format=DataFormat.SFT).exclude(
        sha256=exclude.sha256
    )
    for entry in entries.order_by("pk"):
        quality = _catalog_quality(entry)
        if quality is None or quality in UNRELIABLE_LABELS:
            continue
        try:
            rows = _rows(entry)
        except ApplicationError:
            continue  # a catalog entry that no longer parses labels nothing (data provenance reports it)
        for row in rows:
            labels.setdefault(row["prompt"], set()).add(row["completion"])
    return labels


_ROWS_CACHE: dict[str, list[dict[str, str]]] = {}


def _rows(entry: DataEntry) -> list[dict[str, str]]:
    """An SFT entry's (prompt, completion) rows; content-addressed, so a process may keep them."""
    if entry.sha256 not in _ROWS_CACHE:
        rows = [
            {"prompt": r["prompt"], "completion": r["completion"]}
            for r in data_load_rows(entry=entry)
            if isinstance(r.get("prompt"), str) and isinstance(r.get("completion"), str)
        ]
        if len(_ROWS_CACHE) > 64:
            _ROWS_CACHE.clear()
        _ROWS_CACHE[entry.sha256] = rows
    return _ROWS_CACHE[entry.sha256]


def _order(sha256: str, index: int) -> str:
    return hashlib.sha256(f"{sha256}:{index}".encode()).hexdigest()


def sample_rows(entry: DataEntry, labels: dict[str, set[str]]) -> list[dict[str, str]]:
    """At most MAX_TEACHER_ROWS rows: those with a curated label first, each group in a fixed hash order."""
    rows = list(enumerate(_rows(entry)))
    rows.sort(key=lambda item: (item[1]["prompt"] not in labels, _order(entry.sha256, item[0])))
    return [row for _, row in rows[:MAX_TEACHER_ROWS]]


def _settings(benchmark: Any) -> dict[str, Any]:
    """The benchmark's registered inference settings (task.json): what the candidate is run with."""
    return dict(benchmark.settings or {})


def teacher_outputs(
    *, checkpoint: Checkpoint, prompts: list[str], task: dict[str, Any], dataset_sha256: str
) -> list[dict[str, Any]]:
    """The candidate's greedy outputs on ``prompts`` ({"output", "budget_cut"} each), cached once."""
    decoding = task.get("decoding") or {}
    max_new_tokens = int(decoding.get("max_new_tokens", 32))
    stop = [s for s in task.get("stop", []) if isinstance(s, str)]
    params = {"v": CACHE_VERSION, "prompts": prompts, "max_new_tokens": max_new_tokens, "stop": stop}
    digest = hashlib.sha256(canonical_json(params).encode()).hexdigest()
    store = artifact_store()
    key = f"teacher-outputs/{dataset_sha256[:2]}/{dataset_sha256}/{checkpoint.manifest_sha256}-{digest[:32]}.json"
    uri = store.uri(key)
    if store.exists(uri):
        with store.open(uri, "rb") as handle:
            cached = json.loads(handle.read().decode("utf-8"))
        if isinstance(cached, dict) and cached.get("params_sha256") == digest:
            return list(cached["outputs"])
    outputs = _generate(checkpoint, prompts, task, max_new_tokens=max_new_tokens, stop=stop)
    payload = {
        "params_sha256": digest,
        "checkpoint": checkpoint.handle,
        "manifest_sha256": checkpoint.manifest_sha256,
        "dataset_sha256": dataset_sha256,
        "outputs": outputs,
    }
    if not store.exists(uri):  # write-once: what was recorded first stays
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "outputs.json"
            path.write_text(json.dumps(payload), encoding="utf-8")
            store.put_file(path, key=key)
    return outputs


def _generate(
    checkpoint: Checkpoint, prompts: list[str], task: dict[str, Any], *, max_new_tokens: int, stop: list[str]
) -> list[dict[str, Any]]:
    # Heavy (torch, transformers): imported when a comparison actually runs, not with the checks.
    from apps.ml.checkpoints import load_checkpoint  # noqa: PLC0415
    from apps.ml.inference import generate_texts, uses_special_tokens  # noqa: PLC0415

    try:
        directory = checkpoint_local_dir(checkpoint=checkpoint)
        model, tokenizer = load_checkpoint(Path(directory))
    except (ApplicationError, OSError, ValueError, RuntimeError) as exc:
        raise TeacherUnavailable(f"{checkpoint.handle} cannot be loaded as a model: {str(exc)[:200]}") from None
    texts = generate_texts(
        model,
        tokenizer,
        prompts,
        max_new_tokens=max_new_tokens,
        stop=stop,
        add_special_tokens=uses_special_tokens(task),
    )
    outputs = []
    for text in texts:
        tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        outputs.append({"output": text, "budget_cut": tokens >= max_new_tokens})
    return outputs


def _spaced(text: str) -> str:
    return " ".join(text.split())


def compare(*, entry: DataEntry, checkpoint: Checkpoint, benchmark: Any, labels: dict[str, set[str]]) -> Agreement:
    """Agreement of ``entry``'s completions with ``checkpoint``'s greedy outputs, beyond correctness."""
    rows = sample_rows(entry, labels)
    result = Agreement(dataset=entry.handle, teacher=checkpoint.handle, rows_compared=len(rows))
    if not rows:
        return result
    task = _settings(benchmark)
    scorer = benchmark_scorer(benchmark=benchmark)
    outputs = teacher_outputs(
        checkpoint=checkpoint, prompts=[r["prompt"] for r in rows], task=task, dataset_sha256=entry.sha256
    )
    for row, out in zip(rows, outputs, strict=True):
        text = str(out["output"])
        # Exact up to whitespace: a distiller that trims or re-spaces an output has still copied it.
        same = _spaced(row["completion"]) == _spaced(text)
        result.exact_agreement += same
        known = labels.get(row["prompt"])
        wrong = bool(known) and not any(scorer(text, label) for label in known or ())
        quirk = bool(out.get("budget_cut")) or not text.strip()
        if wrong:
            result.wrong_rows += 1
            result.wrong_agreement += same
        elif quirk:
            result.quirk_rows += 1
            result.quirk_agreement += same
        if same and (wrong or quirk) and len(result.examples) < 5:
            result.examples.append(
                {
                    "prompt": row["prompt"][:200],
                    "completion": row["completion"][:200],
                    "kind": "wrong" if wrong else "quirk",
                }
            )
    return result
