"""Data transforms: pure functions from rows to rows, with parameters checked up front.

No Django, no I/O: ``services.data_transform`` loads the input entries, calls one of these and
registers the output. Each returns ``(rows, report)``; the report (counts, what was dropped and
why) becomes the new entry's provenance readme. Bad parameters raise ``TransformError`` with a
message an agent can act on.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from datasketch import MinHash, MinHashLSH

from apps.integrity.contamination import ContaminationScanner, normalize_tokens

Row = dict[str, Any]
Report = dict[str, Any]

MAX_REGEX_CHARS = 500
FORMAT_COLUMNS: dict[str, tuple[str, ...]] = {
    "sft": ("prompt", "completion"),
    "dpo": ("prompt", "chosen", "rejected"),
}


class TransformError(ValueError):
    """Parameters or inputs a transform cannot work with; ``code`` is stable for agents."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _allowed(params: dict[str, Any], allowed: set[str], op: str) -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise TransformError("bad_params", f"{op}: unknown parameter(s) {unknown}; allowed: {sorted(allowed)}")


def _text(row: Row, column: str | None) -> str:
    if column is None:
        return "\n".join(str(v) for v in row.values() if isinstance(v, str))
    if column not in row:
        raise TransformError("bad_params", f"column {column!r} is not in the data (columns: {sorted(row)})")
    value = row[column]
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _int(params: dict[str, Any], key: str, *, low: int = 0, high: int = 10**9) -> int | None:
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TransformError("bad_params", f"{key} must be an integer in [{low}, {high}], got {value!r}")
    return value


def _float(params: dict[str, Any], key: str, default: float, *, low: float, high: float) -> float:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= float(value) <= high:
        raise TransformError("bad_params", f"{key} must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _regex(pattern: Any, key: str) -> re.Pattern[str]:
    if not isinstance(pattern, str) or len(pattern) > MAX_REGEX_CHARS:
        raise TransformError("bad_params", f"{key} must be a string of at most {MAX_REGEX_CHARS} characters")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise TransformError("bad_params", f"{key} is not a valid regular expression: {exc}") from None


# --------------------------------------------------------------------------- filter

_PREDICATES: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "contains": lambda a, b: isinstance(a, str) and str(b) in a,
    "not_contains": lambda a, b: not (isinstance(a, str) and str(b) in a),
    "in": lambda a, b: a in b,
    "not_in": lambda a, b: a not in b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}


def filter_rows(rows: Sequence[Row], params: dict[str, Any]) -> tuple[list[Row], Report]:
    """Keep rows that pass every given test.

    ``column`` (default: all text columns joined) is what ``min_chars``/``max_chars``,
    ``regex`` (keep matches) and ``exclude_regex`` (drop matches) look at; ``where`` is a list of
    ``{"column", "op", "value"}`` predicates (ops: eq ne contains not_contains in not_in lt le gt ge).
    """
    _allowed(params, {"column", "min_chars", "max_chars", "regex", "exclude_regex", "where"}, "filter")
    column = params.get("column")
    if column is not None and not isinstance(column, str):
        raise TransformError("bad_params", "column must be a column name")
    min_chars, max_chars = _int(params, "min_chars"), _int(params, "max_chars")
    keep = _regex(params["regex"], "regex") if "regex" in params else None
    drop = _regex(params["exclude_regex"], "exclude_regex") if "exclude_regex" in params else None
    where = params.get("where", [])
    if isinstance(where, dict):
        where = [where]
    if not isinstance(where, list):
        raise TransformError("bad_params", "where must be a list of {column, op, value} objects")
    for clause in where:
        if not isinstance(clause, dict) or set(clause) != {"column", "op", "value"}:
            raise TransformError("bad_params", f"where clause {clause!r} needs exactly column, op and value")
        if clause["op"] not in _PREDICATES:
            raise TransformError("bad_params", f"where op {clause['op']!r} is not one of {sorted(_PREDICATES)}")
    if not any(k in params for k in ("min_chars", "max_chars", "regex", "exclude_regex", "where")):
        raise TransformError(
            "bad_params", "filter needs at least one of min_chars, max_chars, regex, exclude_regex, where"
        )

    dropped: dict[str, int] = {}
    out: list[Row] = []
    for row in rows:
        text = _text(row, column)
        reason = None
        if min_chars is not None and len(text) < min_chars:
            reason = "shorter than min_chars"
        elif max_chars is not None and len(text) > max_chars:
            reason = "longer than max_chars"
        elif keep is not None and not keep.search(text):
            reason = "no regex match"
        elif drop is not None and drop.search(text):
            reason = "exclude_regex match"
        else:
            for clause in where:
                if clause["column"] not in row:
                    raise TransformError("bad_params", f"where column {clause['column']!r} is not in the data")
                try:
                    ok = _PREDICATES[clause["op"]](row[clause["column"]], clause["value"])
                except TypeError:
                    ok = False
                if not ok:
                    reason = f"where {clause['column']} {clause['op']} failed"
                    break
        if reason is None:
            out.append(row)
        else:
            dropped[reason] = dropped.get(reason, 0) + 1
    return out, {"kept": len(out), "dropped": sum(dropped.values()), "dropped_by_reason": dropped}


# --------------------------------------------------------------------------- deduplicate


def deduplicate_rows(rows: Sequence[Row], params: dict[str, Any]) -> tuple[list[Row], Report]:
    """Drop exact duplicates (after normalisation) and, unless ``near`` is false, near duplicates.

    Near duplicates: MinHash-LSH over word ``shingle``-grams of the chosen ``columns`` (default
    all), confirmed by exact Jaccard >= ``threshold``. The first occurrence is kept.
    """
    _allowed(params, {"columns", "near", "threshold", "shingle", "num_perm"}, "deduplicate")
    columns = params.get("columns")
    if columns is not None and (not isinstance(columns, list) or not all(isinstance(c, str) for c in columns)):
        raise TransformError("bad_params", "columns must be a list of column names")
    near = params.get("near", True)
    if not isinstance(near, bool):
        raise TransformError("bad_params", "near must be true or false")
    threshold = _float(params, "threshold", 0.9, low=0.5, high=1.0)
    shingle = _int(params, "shingle", low=1, high=10) or 3
    num_perm = _int(params, "num_perm", low=16, high=512) or 128

    def tokens(row: Row) -> list[str]:
        if columns is None:
            return normalize_tokens(_text(row, None))
        return [t for c in columns for t in normalize_tokens(_text(row, c))]

    seen: set[str] = set()
    proto = MinHash(num_perm=num_perm)
    lsh = MinHashLSH(threshold=max(0.1, threshold - 0.1), num_perm=num_perm)
    kept_shingles: list[frozenset[str]] = []
    out: list[Row] = []
    exact = near_count = 0
    for row in rows:
        toks = tokens(row)
        digest = hashlib.sha256(" ".join(toks).encode("utf-8")).hexdigest()
        if digest in seen:
            exact += 1
            continue
        seen.add(digest)
        if near:
            if len(toks) <= shingle:
                shingles = frozenset([" ".join(toks)])
            else:
                shingles = frozenset(" ".join(toks[i : i + shingle]) for i in range(len(toks) - shingle + 1))
            sketch = MinHash(num_perm=num_perm, permutations=proto.permutations, scheme=proto.scheme)
            sketch.update_batch([s.encode("utf-8") for s in shingles])
            duplicate = any(
                len(kept_shingles[i] & shingles) / max(1, len(kept_shingles[i] | shingles)) >= threshold
                for i in lsh.query(sketch)
            )
            if duplicate:
                near_count += 1
                continue
            lsh.insert(len(kept_shingles), sketch, check_duplication=False)
            kept_shingles.append(shingles)
        out.append(row)
    return out, {"kept": len(out), "exact_duplicates": exact, "near_duplicates": near_count, "threshold": threshold}


# --------------------------------------------------------------------------- mix


def mix_rows(inputs: Sequence[Sequence[Row]], params: dict[str, Any]) -> tuple[list[Row], Report]:
    """A seeded, weighted mixture: ``total`` rows (default: all inputs' rows), input i contributing
    ``total * weights[i] / sum(weights)`` rows, sampled without replacement while rows last."""
    _allowed(params, {"weights", "total", "seed"}, "mix")
    if len(inputs) < 2:
        raise TransformError("bad_params", "mix needs at least two inputs")
    weights = params.get("weights", [1.0] * len(inputs))
    if (
        not isinstance(weights, list)
        or len(weights) != len(inputs)
        or not all(isinstance(w, int | float) and not isinstance(w, bool) and w >= 0 for w in weights)
        or sum(weights) <= 0
    ):
        raise TransformError("bad_params", f"weights must be {len(inputs)} non-negative numbers with a positive sum")
    total = _int(params, "total", low=1, high=10_000_000) or sum(len(rows) for rows in inputs)
    seed = _int(params, "seed", low=0, high=2**63 - 1) or 0
    rng = random.Random(seed)  # noqa: S311 - a reproducible sample, not a secret
    scale = sum(weights)
    counts = [int(total * w / scale) for w in weights]
    # Hand out the rounding remainder to the largest fractional parts, so the total is exact.
    remainders = sorted(range(len(weights)), key=lambda i: -(total * weights[i] / scale - counts[i]))
    for i in remainders[: total - sum(counts)]:
        counts[i] += 1
    out: list[Row] = []
    for rows, count in zip(inputs, counts, strict=True):
        if count and not rows:
            raise TransformError("bad_params", "an input with a positive weight has no rows")
        full, rest = divmod(count, len(rows)) if rows else (0, 0)
        out.extend(list(rows) * full)
        out.extend(rng.sample(list(rows), rest))
    rng.shuffle(out)
    return out, {"total": len(out), "per_input": counts, "weights": weights, "seed": seed}


# --------------------------------------------------------------------------- convert

CHAT_TEMPLATE = "User: {prompt}\nAssistant:"


def convert_rows(rows: Sequence[Row], params: dict[str, Any]) -> tuple[list[Row], Report]:
    """Change the shape of rows.

    ``mode``:
    - ``rename``: ``mapping`` {old: new}; ``drop``: columns to remove.
    - ``template``: wrap ``prompt`` in ``template`` (must contain ``{prompt}``; default a chat
      turn "User: …\\nAssistant:") — e.g. plain SFT into chat-formatted text.
    - ``dpo_to_sft``: keep ``prompt`` and ``chosen`` (as ``completion``).
    """
    mode = params.get("mode")
    if mode == "rename":
        _allowed(params, {"mode", "mapping", "drop"}, "convert/rename")
        mapping = params.get("mapping", {})
        drop = params.get("drop", [])
        if not isinstance(mapping, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
        ):
            raise TransformError("bad_params", "mapping must be an object of {old_column: new_column}")
        if not isinstance(drop, list) or not all(isinstance(c, str) for c in drop):
            raise TransformError("bad_params", "drop must be a list of column names")
        if not mapping and not drop:
            raise TransformError("bad_params", "rename needs a mapping or columns to drop")
        out = []
        for row in rows:
            missing = [c for c in mapping if c not in row]
            if missing:
                raise TransformError("bad_params", f"rename: column(s) {missing} are not in the data")
            out.append({mapping.get(k, k): v for k, v in row.items() if k not in drop})
        return out, {"mode": mode, "mapping": mapping, "dropped_columns": drop}
    if mode == "template":
        _allowed(params, {"mode", "template"}, "convert/template")
        template = params.get("template", CHAT_TEMPLATE)
        if not isinstance(template, str) or template.count("{prompt}") != 1 or len(template) > 2000:
            raise TransformError("bad_params", "template must be a string with exactly one {prompt} slot")
        out = []
        for row in rows:
            if not isinstance(row.get("prompt"), str):
                raise TransformError("bad_params", "template needs a string prompt column")
            # str.replace, not format: prompts may contain braces.
            out.append({**row, "prompt": template.replace("{prompt}", row["prompt"])})
        return out, {"mode": mode, "template": template}
    if mode == "dpo_to_sft":
        _allowed(params, {"mode"}, "convert/dpo_to_sft")
        out = []
        for row in rows:
            if "prompt" not in row or "chosen" not in row:
                raise TransformError("bad_params", "dpo_to_sft needs prompt and chosen columns")
            out.append({"prompt": row["prompt"], "completion": row["chosen"]})
        return out, {"mode": mode}
    raise TransformError("bad_params", "convert needs mode: rename, template or dpo_to_sft")


# --------------------------------------------------------------------------- decontaminate


def decontaminate_rows(rows: Sequence[Row], scanner: ContaminationScanner) -> tuple[list[Row], Report]:
    """Drop every row that overlaps a sealed item (exact, n-gram or near duplicate).

    The report carries counts only: the matched spans are sealed text and the readme is readable
    by Workers.
    """
    matches = scanner.scan(rows)
    flagged = {m.row_index for m in matches}
    by_kind: dict[str, int] = {}
    for match in matches:
        by_kind[match.kind] = by_kind.get(match.kind, 0) + 1
    out = [row for i, row in enumerate(rows) if i not in flagged]
    return out, {
        "kept": len(out),
        "removed": len(flagged),
        "matches_by_kind": by_kind,
        "sealed_items_hit": len({m.sample_id for m in matches}),
        "ngram": scanner.ngram,
        "threshold": scanner.threshold,
    }
