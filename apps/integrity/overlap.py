"""Overlap of a datapool entry with a benchmark's sealed items, for both layers of integrity.

The submission review (prevention) refuses data above the run's tolerance before it is trained
on; the data-provenance check (observation) measures the same overlap after a run; the data tools
show it to Workers as counts. One function, so the three can never disagree.

Layers. The lexical layers come from the scanner (``contamination.py``: ``exact``, ``ngram``,
``near_dup`` and, where the scanner has it, ``salient``); the semantic ones from ``semantic.py``
(``embedding``, offline; ``llm_judge``, when an endpoint is configured). The run policy names the
layers it requires and those it runs when it can (``contamination_layers``, see
:data:`DEFAULT_LAYERS`). Every result carries each layer's status:

- ``ran``             the layer looked at every row it is meant to (rows another layer already
                      matched are not embedded or judged again);
- ``not_installed``   the code or model it needs is not there (a scanner without the layer, the
                      embedding package missing or its weights altered);
- ``not_configured``  it needs configuration that is absent (the judge's endpoint);
- ``failed``          it crashed or answered out of format (the judge);
- ``unknown_layer``   the policy names a layer nobody implements (a typo fails closed too).

``required_missing`` lists the required layers whose status is not ``ran``: the review and the
check then cannot call the data clean (fail closed). An optional layer that did not run is only
written into the evidence.

Tolerance (``contamination_tolerance``) counts *distinct sealed sample ids* matched across every
dataset trained into the weights: the submission's and those of its input checkpoint's lineage back
to θ0 (:func:`lineage_datasets`, :func:`sealed_ids_over_tolerance`). Three rows per dataset over
sixteen datasets, or over successive trainings, are 48 items, not sixteen times three.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import benchmark_scanner, benchmark_sealed_items
from apps.core.hashing import canonical_json
from apps.datapool.models import DataEntry
from apps.datapool.services import data_load_rows
from apps.experiments.models import Checkpoint
from apps.experiments.selectors import checkpoint_lineage
from apps.integrity import contamination
from apps.integrity.contamination import ContaminationScanner, normalize_tokens
from apps.integrity.semantic import (
    DEFAULT_EMBEDDING_THRESHOLD,
    JudgeError,
    LayerUnavailable,
    SemanticIndex,
    judge_config,
    judge_scan,
)
from apps.jobs.choices import JobKind

logger = logging.getLogger(__name__)

# Scanners index a benchmark's sealed items once; overlap results are per (data bytes, sealed
# bytes, layers). The keys are content hashes, so a cached answer can never be stale; the caps bound memory.
_SCANNERS: dict[tuple[int, str, tuple[str, ...]], ContaminationScanner] = {}
_INDEXES: dict[tuple[int, str], SemanticIndex] = {}
_OVERLAPS: dict[tuple[Any, ...], dict[str, Any]] = {}
_MAX_SCANNERS = 16
_MAX_OVERLAPS = 256
MAX_OVERLAP_MATCHES = 200

SCANNER_LAYERS: tuple[str, ...] = tuple(getattr(contamination, "LAYERS", ("exact", "ngram", "near_dup")))
SEMANTIC_LAYERS = ("embedding", "llm_judge")
# Layers this code base implements somewhere (a scanner may lack one: ``not_installed``).
KNOWN_LAYERS = frozenset(("exact", "ngram", "near_dup", "salient", *SCANNER_LAYERS, *SEMANTIC_LAYERS))
# What a run requires unless its policy says otherwise (apps/research/models.py default_policy).
DEFAULT_LAYERS: dict[str, list[str]] = {
    "required": ["exact", "ngram", "near_dup", "salient", "embedding"],
    "optional": ["llm_judge"],
}
RAN = "ran"


def layer_policy(policy: dict[str, Any] | None) -> dict[str, list[str]]:
    """The run's ``contamination_layers`` (required / optional), defaults where absent.

    A layer named in both lists is required. Anything that is not a list of names falls back to
    the defaults for that list rather than to "nothing required".
    """
    given = (policy or {}).get("contamination_layers")
    given = given if isinstance(given, dict) else {}
    out: dict[str, list[str]] = {}
    for key in ("required", "optional"):
        names = given.get(key, DEFAULT_LAYERS[key])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            names = DEFAULT_LAYERS[key]
        out[key] = sorted(set(names))
    out["optional"] = [n for n in out["optional"] if n not in out["required"]]
    return out


def embedding_threshold(policy: dict[str, Any] | None) -> float:
    value = (policy or {}).get("contamination_embedding_threshold", DEFAULT_EMBEDDING_THRESHOLD)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return DEFAULT_EMBEDDING_THRESHOLD
    return number if 0 < number <= 1 else DEFAULT_EMBEDDING_THRESHOLD


def _sealed_key(benchmark: Benchmark) -> str:
    return canonical_json([benchmark.data_sha256, benchmark.settings_sha256])


def _templates(benchmark: Benchmark) -> list[str]:
    template = str((benchmark.settings or {}).get("prompt_template", ""))
    return [template] if template else []


def sealed_scanner(*, benchmark: Benchmark, layers: tuple[str, ...] = SCANNER_LAYERS) -> ContaminationScanner:
    """A scanner over the benchmark's sealed items (feedback and final), verified when loaded.

    ``layers``: the scanner layers to run (all by default), so that a policy without a strong
    layer still gets a weaker layer's matches (the scanner reports the strongest kind per row
    and item). Raises ``SealBroken`` when the sealed data fails
    its hashes: the review then fails closed (nothing runs) rather than passing data it could not check.
    """
    chosen = tuple(n for n in SCANNER_LAYERS if n in layers)
    key = (benchmark.pk, _sealed_key(benchmark), chosen)
    scanner = _SCANNERS.get(key)
    if scanner is None:
        # SealBroken (409 seal_broken) propagates: nothing is checked against unverified items.
        scanner = benchmark_scanner(benchmark=benchmark, layers=chosen)
        if len(_SCANNERS) >= _MAX_SCANNERS:
            _SCANNERS.pop(next(iter(_SCANNERS)))
        _SCANNERS[key] = scanner
    return scanner


def semantic_index(*, benchmark: Benchmark) -> SemanticIndex:
    """The benchmark's sealed items prepared for the semantic layers; embeddings cached on disk
    beside the sealed data (derived from it, so kept where only the system reads)."""
    key = (benchmark.pk, _sealed_key(benchmark))
    index = _INDEXES.get(key)
    if index is None:
        index = SemanticIndex(
            benchmark_sealed_items(benchmark=benchmark),
            templates=_templates(benchmark),
            cache_dir=Path(settings.SEALED_ROOT) / ".embeddings",
        )
        if len(_INDEXES) >= _MAX_SCANNERS:
            _INDEXES.pop(next(iter(_INDEXES)))
        _INDEXES[key] = index
    return index


def _layer(status: str, *, required: bool, detail: str = "", matches: int = 0) -> dict[str, Any]:
    record: dict[str, Any] = {"status": status, "required": required, "matches": matches}
    if detail:
        record["detail"] = detail[:300]
    return record


def data_overlap(*, entry: DataEntry, benchmark: Benchmark, policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """How a datapool entry overlaps a benchmark's sealed items (:func:`rows_overlap` on its stored rows)."""
    return rows_overlap(
        rows=None, load=lambda: data_load_rows(entry=entry), sha256=entry.sha256, label=entry.handle,
        benchmark=benchmark, policy=policy,
    )  # fmt: skip


def rows_overlap(
    *,
    rows: list[dict[str, Any]] | None,
    sha256: str,
    label: str,
    benchmark: Benchmark,
    policy: dict[str, Any] | None = None,
    load: Callable[[], list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """How rows (a datapool entry's, or data about to be registered) overlap a benchmark's sealed items.

    ``sha256`` is the rows' bytes' digest (the cache key), ``label`` names them in logs; ``load``
    reads the rows when ``rows`` is None and the answer is not cached.

    ``policy`` is the run's (its ``contamination_layers`` and embedding threshold); None means the
    defaults. ``matches`` carry sample ids and the matching span of the sealed *prompt* (never an
    answer); ``sample_ids`` every distinct sealed id matched; both are reviewer-level evidence and
    never reach a Worker. ``layers`` has each layer's status, ``required_missing`` the required
    layers that did not run.
    """
    layers = layer_policy(policy)
    threshold = embedding_threshold(policy)
    wanted = [*layers["required"], *layers["optional"]]
    judge = judge_config() if "llm_judge" in wanted else None
    key = (
        sha256,
        benchmark.pk,
        _sealed_key(benchmark),
        canonical_json(layers),
        threshold,
        (judge.base_url, judge.model) if judge is not None else None,
    )
    cached = _OVERLAPS.get(key)
    if cached is not None:
        return cached
    if rows is None:
        if load is None:
            raise ValueError("rows_overlap needs the rows or a way to load them")
        rows = load()
    required = set(layers["required"])
    status: dict[str, dict[str, Any]] = {}
    matches: list[Any] = []

    # Lexical layers (SealBroken propagates: see sealed_scanner).
    scanner_wanted = [n for n in wanted if n in SCANNER_LAYERS]
    scanner = sealed_scanner(benchmark=benchmark, layers=tuple(scanner_wanted) or SCANNER_LAYERS)
    try:
        lexical = [m for m in scanner.scan(rows) if m.kind in scanner_wanted]
        for name in scanner_wanted:
            status[name] = _layer(RAN, required=name in required, matches=sum(1 for m in lexical if m.kind == name))
        matches += lexical
    except Exception as exc:  # noqa: BLE001 - a crashed layer is a status, and fails closed if required
        logger.exception("contamination scanner failed on %s", label)
        for name in scanner_wanted:
            status[name] = _layer("failed", required=name in required, detail=f"{type(exc).__name__}: {exc}")

    matched_rows = {m.row_index for m in matches}
    index: SemanticIndex | None = None
    if "embedding" in wanted or (judge is not None and "llm_judge" in wanted):
        try:
            index = semantic_index(benchmark=benchmark)
            index.vectors()  # loads the model: a missing package or altered weights shows here
        except LayerUnavailable as exc:
            for name in ("embedding", "llm_judge"):
                if name in wanted and not (name == "llm_judge" and judge is None):
                    status[name] = _layer(exc.status, required=name in required, detail=exc.detail)
            index = None
        except Exception as exc:  # noqa: BLE001 - the same: a status, never a silent pass
            logger.exception("embedding index failed for %s", benchmark)
            for name in ("embedding", "llm_judge"):
                if name in wanted and not (name == "llm_judge" and judge is None):
                    status[name] = _layer("failed", required=name in required, detail=f"{type(exc).__name__}: {exc}")
            index = None
    if index is not None and "embedding" in wanted:
        try:
            semantic = index.scan(rows, threshold=threshold, skip=matched_rows)
            status["embedding"] = _layer(RAN, required="embedding" in required, matches=len(semantic))
            matches += semantic
            matched_rows |= {m.row_index for m in semantic}
        except Exception as exc:  # noqa: BLE001
            logger.exception("embedding layer failed on %s", label)
            status["embedding"] = _layer(
                "failed", required="embedding" in required, detail=f"{type(exc).__name__}: {exc}"
            )
    if "llm_judge" in wanted:
        if judge is None:
            status["llm_judge"] = _layer(
                "not_configured",
                required="llm_judge" in required,
                detail="set RSI_LLM_BASE_URL_JUDGE and RSI_LLM_MODEL_JUDGE to run the LLM judge",
            )
        elif index is not None:
            try:
                judged, info = judge_scan(index, rows, judge, skip=matched_rows)
                status["llm_judge"] = {
                    **_layer(RAN, required="llm_judge" in required, matches=len(judged)),
                    **info,
                }
                matches += judged
            except JudgeError as exc:
                status["llm_judge"] = _layer("failed", required="llm_judge" in required, detail=str(exc))
            except Exception as exc:  # noqa: BLE001 - a status, never a silent pass
                logger.exception("LLM judge layer failed on %s", label)
                detail = f"{type(exc).__name__}: {exc}"
                status["llm_judge"] = _layer("failed", required="llm_judge" in required, detail=detail)
    for name in wanted:
        if name not in status:  # named by the policy, run by nobody
            known = name in KNOWN_LAYERS
            status[name] = _layer(
                "not_installed" if known else "unknown_layer",
                required=name in required,
                detail="this contamination scanner has no such layer" if known else "no layer of this name exists",
            )

    matches.sort(key=lambda m: (m.row_index, m.sample_id, m.kind))
    missing = sorted(n for n in layers["required"] if status[n]["status"] != RAN)
    result = {
        "benchmark": f"{benchmark.name}@{benchmark.version}",
        "sealed_items": len(scanner),
        "rows_scanned": len(rows),
        "rows_matched": len({m.row_index for m in matches}),
        "items_matched": len({m.sample_id for m in matches}),
        "by_kind": dict(Counter(m.kind for m in matches)),
        "matches": [_match_evidence(m, rows[m.row_index]) for m in matches[:MAX_OVERLAP_MATCHES]],
        "truncated": len(matches) > MAX_OVERLAP_MATCHES,
        "sample_ids": sorted({m.sample_id for m in matches}),
        "layers": dict(sorted(status.items())),
        "required_missing": missing,
    }
    if not missing and not any(s["status"] == "failed" for s in status.values()):
        # Only complete answers are kept: a layer installed, configured or recovered later runs then.
        if len(_OVERLAPS) >= _MAX_OVERLAPS:
            _OVERLAPS.pop(next(iter(_OVERLAPS)))
        _OVERLAPS[key] = result
    return result


def _match_evidence(match: Any, row: dict[str, Any]) -> dict[str, Any]:
    span = match.span
    if match.kind not in ("exact", "ngram"):
        # Spans of the other layers are the whole row, completion included, which for a copied
        # item is the sealed answer; the prompt alone is the evidence a reviewer needs.
        span = " ".join(normalize_tokens(str(row.get("prompt", ""))))
    return {
        "row": match.row_index,
        "sample_id": match.sample_id,
        "kind": match.kind,
        "span": span[:500],
        "score": round(float(match.score), 4),
    }


def over_tolerance(rows_matched: int, rows: int, tolerance: float) -> bool:
    """``tolerance`` >= 1 is a number of rows; below 1 it is a share of the dataset's rows.

    One dataset's rows: what the data tools show. Decisions count sealed ids across the whole
    training (:func:`sealed_ids_over_tolerance`)."""
    if tolerance >= 1:
        return rows_matched > tolerance
    return rows_matched > tolerance * max(rows, 1)


def sealed_ids_over_tolerance(sample_ids: int, sealed_items: int, tolerance: float) -> bool:
    """``tolerance`` >= 1 is a number of distinct sealed items; below 1 a share of the benchmark's
    sealed items. ``sample_ids``: the distinct ids matched across every dataset in the weights."""
    if tolerance >= 1:
        return sample_ids > tolerance
    return sample_ids > tolerance * max(sealed_items, 1)


def lineage_datasets(checkpoint: Checkpoint | None, *, base: Checkpoint | None = None) -> list[tuple[DataEntry, str]]:
    """(entry, via) of every dataset trained into ``checkpoint`` and its ancestors back to θ0.

    ``via`` is the producing experiment's handle (or the job's uuid). θ0 itself (a base) and links
    not made by a training job contribute nothing.
    """
    if checkpoint is None:
        return []
    ids = checkpoint_lineage(checkpoint, base=base).path
    found = {c.pk: c for c in Checkpoint.objects.filter(pk__in=ids).select_related("producing_job__experiment")}
    out: list[tuple[DataEntry, str]] = []
    seen: set[tuple[int, str]] = set()
    for link in (found[i] for i in ids if i in found):
        job = link.producing_job
        if link.is_base or job is None or job.kind != JobKind.TRAIN:
            continue
        via = job.experiment.handle if job.experiment is not None else f"job:{job.uuid}"
        uuids = [item.get("uuid") for item in job.spec.get("data", []) if isinstance(item, dict)]
        for entry in DataEntry.objects.filter(uuid__in=[u for u in uuids if u]).order_by("pk"):
            if (entry.pk, via) not in seen:
                seen.add((entry.pk, via))
                out.append((entry, via))
    return out


def union_sample_ids(overlaps: Iterable[dict[str, Any]]) -> set[str]:
    ids: set[str] = set()
    for overlap in overlaps:
        ids.update(overlap.get("sample_ids") or [])
    return ids
