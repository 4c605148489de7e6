"""Overlap of a datapool entry with a benchmark's sealed items, for both layers of integrity.

The submission review (prevention) refuses data above the run's tolerance before it is trained
on; the data-provenance check (observation) measures the same overlap after a run; the data tools
show it to Workers as counts. One function, so the three can never disagree.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import benchmark_scanner
from apps.core.hashing import canonical_json
from apps.datapool.models import DataEntry
from apps.datapool.services import data_load_rows
from apps.integrity.contamination import ContaminationScanner, normalize_tokens

# Scanners index a benchmark's sealed items once; overlap results are per (data bytes, sealed
# bytes). Both keys are content hashes, so a cached answer can never be stale; the caps bound memory.
_SCANNERS: dict[tuple[int, str], ContaminationScanner] = {}
_OVERLAPS: dict[tuple[str, int, str], dict[str, Any]] = {}
_MAX_SCANNERS = 16
_MAX_OVERLAPS = 256
MAX_OVERLAP_MATCHES = 200


def _sealed_key(benchmark: Benchmark) -> str:
    return canonical_json([benchmark.data_sha256, benchmark.settings_sha256])


def sealed_scanner(*, benchmark: Benchmark) -> ContaminationScanner:
    """A scanner over the benchmark's sealed items (feedback and final), verified when loaded.

    Raises ``SealBroken`` when the sealed data fails its hashes: the review then fails closed
    (nothing runs) rather than passing data it could not check.
    """
    key = (benchmark.pk, _sealed_key(benchmark))
    scanner = _SCANNERS.get(key)
    if scanner is None:
        # SealBroken (409 seal_broken) propagates: nothing is checked against unverified items.
        scanner = benchmark_scanner(benchmark=benchmark)
        if len(_SCANNERS) >= _MAX_SCANNERS:
            _SCANNERS.pop(next(iter(_SCANNERS)))
        _SCANNERS[key] = scanner
    return scanner


def data_overlap(*, entry: DataEntry, benchmark: Benchmark) -> dict[str, Any]:
    """How a datapool entry overlaps a benchmark's sealed items: counts, and matches for reviewers.

    ``matches`` carry sample ids and the matching span of the sealed *prompt* (never an answer);
    they are reviewer-level evidence and never reach a Worker.
    """
    key = (entry.sha256, benchmark.pk, _sealed_key(benchmark))
    cached = _OVERLAPS.get(key)
    if cached is not None:
        return cached
    scanner = sealed_scanner(benchmark=benchmark)
    rows = data_load_rows(entry=entry)
    matches = scanner.scan(rows)
    result = {
        "benchmark": f"{benchmark.name}@{benchmark.version}",
        "sealed_items": len(scanner),
        "rows_scanned": len(rows),
        "rows_matched": len({m.row_index for m in matches}),
        "items_matched": len({m.sample_id for m in matches}),
        "by_kind": dict(Counter(m.kind for m in matches)),
        "matches": [_match_evidence(m, rows[m.row_index]) for m in matches[:MAX_OVERLAP_MATCHES]],
        "truncated": len(matches) > MAX_OVERLAP_MATCHES,
    }
    if len(_OVERLAPS) >= _MAX_OVERLAPS:
        _OVERLAPS.pop(next(iter(_OVERLAPS)))
    _OVERLAPS[key] = result
    return result


def _match_evidence(match: Any, row: dict[str, Any]) -> dict[str, Any]:
    span = match.span
    if match.kind == "near_dup":
        # The scanner's near-duplicate span is the whole row, completion included, which for a
        # copied item is the sealed answer; the prompt alone is the evidence a reviewer needs.
        span = " ".join(normalize_tokens(str(row.get("prompt", ""))))
    return {
        "row": match.row_index,
        "sample_id": match.sample_id,
        "kind": match.kind,
        "span": span[:500],
        "score": round(float(match.score), 4),
    }


def over_tolerance(rows_matched: int, rows: int, tolerance: float) -> bool:
    """``tolerance`` >= 1 is a number of rows; below 1 it is a share of the dataset's rows."""
    if tolerance >= 1:
        return rows_matched > tolerance
    return rows_matched > tolerance * max(rows, 1)
