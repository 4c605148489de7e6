"""Teacher detection: does registered training data agree with a model's greedy outputs beyond correctness?

Data distilled from a model carries that model's fingerprints: its outputs, copied exactly, on the
prompts it was given. Each SFT dataset in play is compared with the greedy outputs of every
candidate teacher on a deterministic sample of the dataset's own prompts (labelled rows first,
then a fixed hash order, at most ``settings.RSI_TEACHER_SAMPLE_ROWS``). Correct data agrees with
any good model on the items that model gets right, so agreement is counted where correctness
does not explain it:

- **telling rows** (as in issue 13): rows whose prompt has a curated label (a completion of a
  catalog set whose card vouches for its labels: :func:`catalog_labels`) that the candidate gets
  wrong under the benchmark's evaluator, and rows where
  the candidate's output is a decoding artefact (cut by the token budget, or empty). Honest data
  gives the label there, not the candidate's answer. Reported at ``teacher_agreement_threshold``
  of at least :data:`MIN_EVIDENCE_ROWS` such rows.
- **open rows** (issue 33): every sampled row whose prompt is in no catalog set (prompts off the
  catalog: no label can say whether the candidate is right there). Honest data agrees there only
  as often as the candidate happens to be right in the data's own form; distilled data agrees on
  every row.
  Reported when at least ``teacher_sample_agreement_threshold`` (measured on the honest corpus:
  docs/run-policy.md) of at least :data:`MIN_OPEN_ROWS` open rows equal the candidate's output.

Candidates (:func:`teacher_candidates`) are every registered checkpoint that is not this run's own
work from θ0 — the benchmark's sealed reference first, other references, bases and checkpoints not
made by a recorded job, this run's checkpoints off θ0's lineage, and the checkpoints other runs
trained (their best-scoring first) — at most ``settings.RSI_TEACHER_MAX_CANDIDATES``. Outputs come
from the project's inference code (:func:`apps.ml.inference.generate_texts`, greedy, batched,
under the benchmark's decoding and stop settings); each is cached in the artifact store by
(checkpoint manifest digest, decoding digest, prompt digest), written once, so a prompt is run
through a checkpoint once whichever dataset or run asks again.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import F, Max, Q

from apps.benchmarks.services import benchmark_scorer, checkpoint_local_dir
from apps.core.errors import ApplicationError
from apps.core.hashing import canonical_json
from apps.datapool.models import DataEntry, DataFormat, SourceKind
from apps.datapool.services import data_load_rows
from apps.datapool.storage import artifact_store
from apps.experiments.models import Checkpoint
from apps.experiments.selectors import checkpoint_lineage

# Fewer telling rows (wrong answers + quirks) than this is too little evidence to say anything.
MIN_EVIDENCE_ROWS = 8
# The share of telling rows agreeing exactly above which a candidate is reported (the run
# policy's ``teacher_agreement_threshold`` overrides it).
DEFAULT_THRESHOLD = 0.5
# Fewer open rows than this is too little evidence for the sample rule.
MIN_OPEN_ROWS = 16
# The share of open rows agreeing exactly above which a candidate is reported (the run policy's
# ``teacher_sample_agreement_threshold`` overrides it). Measured: honest sums worked out by hand
# on off-catalog prompts agree with the ci reference on 0.02 of them, distilled data on all of
# them, 90 % distilled + 10 % hand-made rows on 0.89 (docs/benchmarks.md, "Teacher candidates").
DEFAULT_SAMPLE_THRESHOLD = 0.95
# Bumped when what is cached changes meaning, so an old cache entry is not read as a new one.
CACHE_VERSION = 2
# How many of this run's own checkpoints are walked back to θ0 looking for off-lineage ones.
_OWN_WALK_LIMIT = 200


def max_rows() -> int:
    """The sample bound per dataset (``RSI_TEACHER_SAMPLE_ROWS``)."""
    return max(1, int(getattr(settings, "RSI_TEACHER_SAMPLE_ROWS", 64)))


def max_candidates() -> int:
    """How many candidate teachers are compared (``RSI_TEACHER_MAX_CANDIDATES``)."""
    return max(1, int(getattr(settings, "RSI_TEACHER_MAX_CANDIDATES", 8)))


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
    open_rows: int = 0  # rows whose prompt is in no catalog set (off-catalog prompts)
    open_agreement: int = 0
    examples: list[dict[str, str]] = field(default_factory=list)  # a few copied outputs

    @property
    def telling_rows(self) -> int:
        return self.wrong_rows + self.quirk_rows

    @property
    def telling_agreement(self) -> int:
        return self.wrong_agreement + self.quirk_agreement

    def share(self) -> float:
        return self.telling_agreement / self.telling_rows if self.telling_rows else 0.0

    def open_share(self) -> float:
        return self.open_agreement / self.open_rows if self.open_rows else 0.0

    def rules(self, threshold: float, sample_threshold: float) -> list[str]:
        """Which rules report this comparison: ``telling`` and/or ``sample``."""
        found = []
        if self.telling_rows >= MIN_EVIDENCE_ROWS and self.share() >= threshold:
            found.append("telling")
        if self.open_rows >= MIN_OPEN_ROWS and self.open_share() >= sample_threshold:
            found.append("sample")
        return found

    def high(self, threshold: float, sample_threshold: float = DEFAULT_SAMPLE_THRESHOLD) -> bool:
        return bool(self.rules(threshold, sample_threshold))

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
            "open_rows": self.open_rows,
            "open_agreement": self.open_agreement,
            "open_share": round(self.open_share(), 4),
            "examples": self.examples,
        }


class TeacherUnavailable(Exception):  # noqa: N818 - an outcome recorded in the evidence
    """A candidate checkpoint cannot be run as a model (its files are missing or not weights)."""


@dataclass
class Candidates:
    checkpoints: list[Checkpoint]
    over_bound: int  # eligible checkpoints left out by the bound


def teacher_candidates(*, benchmark: Any, theta0: Checkpoint, run: Any = None) -> Candidates:
    """Every registered checkpoint that is not ``run``'s own work from θ0, in the order compared.

    The benchmark's reference first; then other references, bases and checkpoints not made by a
    recorded job (newest first); then ``run``'s checkpoints whose lineage does not reach θ0; then
    the checkpoints other runs trained, their best score on this benchmark first. Weights equal to
    θ0's or to a listed candidate's (the same manifest) are one candidate. At most
    :func:`max_candidates`; how many were left out is returned.
    """
    bound = max_candidates()
    found: list[Checkpoint] = []
    seen = {theta0.manifest_sha256}
    over = 0

    def offer(checkpoint: Checkpoint) -> None:
        nonlocal over
        if checkpoint.manifest_sha256 in seen:
            return
        seen.add(checkpoint.manifest_sha256)
        if len(found) < bound:
            found.append(checkpoint)
        else:
            over += 1

    if benchmark.reference_checkpoint_id is not None:
        offer(benchmark.reference_checkpoint)
    others = Checkpoint.objects.exclude(pk=theta0.pk)
    if run is not None:
        foreign = others.exclude(run=run)
        own = others.filter(run=run)
    else:
        foreign, own = others, others.none()
    roots = Q(is_reference=True) | Q(is_base=True) | Q(producing_job__isnull=True) | Q(parent__isnull=True)
    for checkpoint in foreign.filter(roots).order_by("-created_at", "-pk").iterator():
        offer(checkpoint)
    for checkpoint in own.order_by("-created_at", "-pk")[:_OWN_WALK_LIMIT]:
        if checkpoint.manifest_sha256 in seen:
            continue
        if not checkpoint_lineage(checkpoint, base=theta0).reaches_base:
            offer(checkpoint)  # in this run, but not descended from θ0 through recorded jobs
    best = Max("evaluations__score", filter=Q(evaluations__benchmark=benchmark))
    trained = foreign.exclude(roots).annotate(best=best).order_by(F("best").desc(nulls_last=True), "-created_at", "-pk")
    for checkpoint in trained.iterator():
        offer(checkpoint)
    return Candidates(found, over)


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


def catalog_labels() -> dict[str, set[str]]:
    """prompt -> curated completions: the rows of every catalog set whose card vouches for its labels.

    The sets are those of the catalog (``MINIBENCH_ROOT/catalog``: every SFT set there, registered
    or not, so honest rows copied from the catalog into a Worker's file are explained by their
    label) and the SFT entries registered from a catalog. Sets whose card declares their labels
    unreliable (``noisy``, ``wrong_format``) or cannot be read never count. A prompt whose trusted
    sources disagree gets all their answers (the candidate is then wrong only when it matches none).
    A Worker's own file is never a label; a vouched catalog set is one wherever it is read (also
    when it is the entry under test: its rows are the catalog's answers, not a model's).
    """
    labels: dict[str, set[str]] = {}
    for prompt, answers in _disk_catalog_labels().items():
        labels.setdefault(prompt, set()).update(answers)
    entries = DataEntry.objects.filter(source_kind=SourceKind.CATALOG, format=DataFormat.SFT)
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


def catalog_prompts() -> set[str]:
    """Every prompt of a catalog set, whatever its card says (the noisy sets' included): problems
    the catalog already has, where only a curated label can say whether a model is right. The
    open-row rule looks only at prompts outside them."""
    prompts = set(_disk_catalog()[1])
    entries = DataEntry.objects.filter(source_kind=SourceKind.CATALOG, format=DataFormat.SFT)
    for entry in entries.order_by("pk"):
        try:
            prompts |= {row["prompt"] for row in _rows(entry)}
        except ApplicationError:
            continue
    return prompts


_DISK_CACHE: dict[tuple[str, ...], tuple[dict[str, set[str]], frozenset[str]]] = {}


def _disk_catalog_labels() -> dict[str, set[str]]:
    return _disk_catalog()[0]


def _disk_catalog() -> tuple[dict[str, set[str]], frozenset[str]]:
    """The catalog under ``MINIBENCH_ROOT``: its vouched SFT sets' labels and every SFT set's
    prompts, read once per set of files."""
    root = Path(getattr(settings, "MINIBENCH_ROOT", "") or ".") / "catalog"
    if not root.is_dir():
        return {}, frozenset()
    sets = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
            data = folder / "data.jsonl"
            stamp = data.stat().st_mtime_ns
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or meta.get("format") != DataFormat.SFT:
            continue
        trusted = isinstance(meta.get("quality"), str) and meta["quality"] not in UNRELIABLE_LABELS
        sets.append((str(data), str(stamp), "1" if trusted else "0"))
    key = tuple(part for triple in sets for part in triple)
    if key not in _DISK_CACHE:
        labels: dict[str, set[str]] = {}
        prompts: set[str] = set()
        for path, _, flag in sets:
            for line in Path(path).read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                    continue
                prompts.add(row["prompt"])
                if flag == "1" and isinstance(row.get("completion"), str):
                    labels.setdefault(row["prompt"], set()).add(row["completion"])
        _DISK_CACHE.clear()
        _DISK_CACHE[key] = (labels, frozenset(prompts))
    return _DISK_CACHE[key]


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
    """At most :func:`max_rows` rows: those with a curated label first, each group in a fixed hash order."""
    rows = list(enumerate(_rows(entry)))
    rows.sort(key=lambda item: (item[1]["prompt"] not in labels, _order(entry.sha256, item[0])))
    return [row for _, row in rows[: max_rows()]]


def _decoding(task: dict[str, Any]) -> dict[str, Any]:
    """What a candidate's output depends on besides its weights and the prompt: the evaluation's
    token budget and stop strings (``apps.ml.seeds``) and whether prompts take the tokenizer's specials."""
    from apps.ml.inference import uses_special_tokens  # noqa: PLC0415 - heavy (torch): only when comparing
    from apps.ml.seeds import max_tokens_of, stop_strings_of  # noqa: PLC0415

    return {
        "v": CACHE_VERSION,
        "max_new_tokens": max_tokens_of(task.get("decoding") or {}),
        "stop": stop_strings_of(task),
        "add_special_tokens": uses_special_tokens(task),
    }


def _prompt_digest(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def _cache_key(checkpoint: Checkpoint, decoding_sha256: str, prompt: str) -> str:
    digest = _prompt_digest(prompt)
    return f"teacher-outputs/{checkpoint.manifest_sha256}/{decoding_sha256[:32]}/{digest[:2]}/{digest}.json"


def teacher_outputs(*, checkpoint: Checkpoint, prompts: list[str], task: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The candidate's greedy outputs on ``prompts`` (prompt -> {"output", "budget_cut"}).

    Each is read from the artifact store's cache (checkpoint manifest, decoding, prompt digest) or
    generated — all the missing ones in one batched pass with one load of the model — and written
    there once, never replaced.
    """
    decoding = _decoding(task)
    decoding_sha256 = hashlib.sha256(canonical_json(decoding).encode()).hexdigest()
    store = artifact_store()
    found: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    for prompt in dict.fromkeys(prompts):
        uri = store.uri(_cache_key(checkpoint, decoding_sha256, prompt))
        if store.exists(uri):
            with store.open(uri, "rb") as handle:
                cached = json.loads(handle.read().decode("utf-8"))
            if isinstance(cached, dict) and cached.get("prompt") == prompt and cached.get("decoding") == decoding:
                found[prompt] = {"output": str(cached["output"]), "budget_cut": bool(cached["budget_cut"])}
                continue
        missing.append(prompt)
    if not missing:
        return found
    generated = _generate(checkpoint, missing, decoding)
    with tempfile.TemporaryDirectory() as tmp:
        for prompt, out in zip(missing, generated, strict=True):
            found[prompt] = out
            key = _cache_key(checkpoint, decoding_sha256, prompt)
            if store.exists(store.uri(key)):
                continue  # write-once: what was recorded first stays
            path = Path(tmp) / "output.json"
            record = {"prompt": prompt, "decoding": decoding, "manifest_sha256": checkpoint.manifest_sha256, **out}
            path.write_text(json.dumps(record), encoding="utf-8")
            store.put_file(path, key=key)
    return found


def _generate(checkpoint: Checkpoint, prompts: list[str], decoding: dict[str, Any]) -> list[dict[str, Any]]:
    # Heavy (torch, transformers): imported when a comparison actually runs, not with the checks.
    from apps.ml.checkpoints import load_checkpoint  # noqa: PLC0415
    from apps.ml.inference import generate_texts  # noqa: PLC0415

    try:
        directory = checkpoint_local_dir(checkpoint=checkpoint)
        model, tokenizer = load_checkpoint(Path(directory))
    except (ApplicationError, OSError, ValueError, RuntimeError) as exc:
        raise TeacherUnavailable(f"{checkpoint.handle} cannot be loaded as a model: {str(exc)[:200]}") from None
    max_new_tokens = decoding["max_new_tokens"]
    texts = generate_texts(
        model,
        tokenizer,
        prompts,
        max_new_tokens=max_new_tokens,
        stop=decoding["stop"],
        add_special_tokens=decoding["add_special_tokens"],
    )
    outputs = []
    for text in texts:
        tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        outputs.append({"output": text, "budget_cut": tokens >= max_new_tokens})
    return outputs


def _spaced(text: str) -> str:
    return " ".join(text.split())


def compare(
    *,
    entry: DataEntry,
    rows: list[dict[str, str]],
    outputs: dict[str, dict[str, Any]],
    checkpoint: Checkpoint,
    scorer: Any,
    labels: dict[str, set[str]],
    known_prompts: set[str] | frozenset[str] = frozenset(),
) -> Agreement:
    """Agreement of ``rows`` (``entry``'s sample) with ``checkpoint``'s greedy ``outputs``, beyond correctness."""
    result = Agreement(dataset=entry.handle, teacher=checkpoint.handle, rows_compared=len(rows))
    for row in rows:
        out = outputs[row["prompt"]]
        text = str(out["output"])
        # Exact up to whitespace: a distiller that trims or re-spaces an output has still copied it.
        same = _spaced(row["completion"]) == _spaced(text)
        result.exact_agreement += same
        known = labels.get(row["prompt"])
        right = bool(known) and any(scorer(text, label) for label in known or ())
        wrong = bool(known) and not right
        quirk = bool(out.get("budget_cut")) or not text.strip()
        if wrong:
            result.wrong_rows += 1
            result.wrong_agreement += same
        elif quirk:
            result.quirk_rows += 1
            result.quirk_agreement += same
        unknown = row["prompt"] not in known_prompts and not known
        if unknown:
            result.open_rows += 1
            result.open_agreement += same
        if same and (wrong or quirk or unknown) and len(result.examples) < 5:
            kind = "wrong" if wrong else "quirk" if quirk else "unlabelled"
            result.examples.append({"prompt": row["prompt"][:200], "completion": row["completion"][:200], "kind": kind})
    return result


def benchmark_task(benchmark: Any) -> dict[str, Any]:
    """The benchmark's registered inference settings (task.json): what the candidate is run with."""
    return dict(benchmark.settings or {})


def scorer_for(benchmark: Any) -> Any:
    return benchmark_scorer(benchmark=benchmark)
