"""JSON-Schema building blocks for tool declarations (JSON Schema 2020-12, as OpenAPI 3.1 uses).

Bounds are part of the contract: every string has a maxLength and every number a range that the
database can store, so a schema-valid call never fails on a column limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from apps.expos.registry import obj

MAX_TEXT = 20_000
# On a oneOf/anyOf of alternatives: {"code", "message"}, the refusal (400) when no alternative fits.
REFUSAL_KEY = "x-refusal"


def alternatives(*branches: dict[str, Any], code: str, message: str, exclusive: bool = True) -> dict[str, Any]:
    """Arguments that are alternatives (exactly one of path or catalog), for a tool's input schema.

    The OpenAPI document, the LLM definitions and the validator all see the rule, so a generated
    body is valid exactly when the server accepts it; a body that fits no alternative is refused
    with ``code`` and ``message`` (views.validate_input), not with a generic schema error.
    """
    return {"oneOf" if exclusive else "anyOf": list(branches), REFUSAL_KEY: {"code": code, "message": message}}


def string(max_length: int = 200, *, min_length: int = 0, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "maxLength": max_length, **extra}
    if min_length:
        schema["minLength"] = min_length
    return schema


def text(max_length: int = 5000, *, min_length: int = 1, **extra: Any) -> dict[str, Any]:
    return string(max_length, min_length=min_length, **extra)


def integer(minimum: int = 0, maximum: int = 2**31 - 1, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum, **extra}


def number(minimum: float | None = None, maximum: float | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "number", **extra}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def boolean(**extra: Any) -> dict[str, Any]:
    return {"type": "boolean", **extra}


def array(items: dict[str, Any], *, max_items: int = 100, min_items: int = 0, unique: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array", "items": items, "maxItems": max_items}
    if min_items:
        schema["minItems"] = min_items
    if unique:
        schema["uniqueItems"] = True
    return schema


def enum(*values: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema, or null (JSON Schema type list; OpenAPI 3.1 accepts it as is)."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def closed(properties: dict[str, Any], *, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """An output object: closed, with every property required except the named optional ones."""
    return obj(properties, required=[name for name in properties if name not in optional])


def free_object() -> dict[str, Any]:
    """A JSON object whose content is data, not our structure (event arguments, an action recipe)."""
    return {"type": "object"}


UUID = {"type": "string", "format": "uuid"}
TIMESTAMP = {"type": "string", "format": "date-time"}
WORKER = string(32, pattern=r"^worker_[0-9]{4,}$", description="A Worker's handle, e.g. worker_0002.")
REVIEWER = string(32, pattern=r"^reviewer_[0-9]{4,}$", description="A Reviewer's handle, e.g. reviewer_0001.")
NODE_HANDLE = string(32, pattern=r"^(worker|reviewer)_[0-9]{4,}$", description="A Worker's or Reviewer's handle.")
EXPERIMENT = string(32, pattern=r"^exp_[0-9]{4,}$", description="An experiment's handle, e.g. exp_0003.")

# --- shared output shapes ------------------------------------------------------------------------

NODE = closed(
    {
        "handle": string(32),
        "uuid": UUID,
        "kind": enum("main", "worker", "reviewer"),
        "status": enum("active", "finalized", "cancelled"),
        "task": string(MAX_TEXT),
        "summary": string(MAX_TEXT),
        "summary_experiments": array(string(32), max_items=10_000),
        "upstream": array(string(32), max_items=10_000),
        "version": integer(1),
        "etag": string(100),
        "created_at": TIMESTAMP,
        "finalized_at": nullable(TIMESTAMP),
    }
)

# A harness run's new Worker or Reviewer: its agent token, in the creating call's answer alone.
SEAT_TOKEN = string(
    100,
    description="Harness (external) runs only: the new node's agent token, shown once in this answer — an "
    "idempotent replay does not repeat it (only its digest is stored). Give it to the sub-agent that plays the "
    "node (RSI_TOKEN, or a Bearer header).",
)
NEW_NODE = closed({**NODE["properties"], "token": SEAT_TOKEN}, optional=("token",))

EXPERIMENT_BRIEF = closed(
    {
        "handle": string(32),
        "uuid": UUID,
        "owner": string(32),
        "kind": string(16),
        "status": string(16),
        "integrity_status": string(16),
        "feedback_score": nullable(number(0, 1)),
    }
)

JOB = closed(
    {
        "uuid": UUID,
        "kind": string(16),
        "status": string(16),
        "queue": string(32),
        "attempt": integer(1),
        "progress": number(0, 1),
        "experiment": nullable(string(32)),
        "cancel_requested": boolean(),
        "error": string(500),
        "created_at": TIMESTAMP,
        "started_at": nullable(TIMESTAMP),
        "finished_at": nullable(TIMESTAMP),
        "resource_seconds": number(0),
    }
)

REPORT = closed(
    {
        "uuid": UUID,
        "reviewer": string(32),
        "status": enum("submitted", "finalized"),
        "summary": string(MAX_TEXT),
        "experiments": array(string(32), max_items=10_000),
        "supported_findings": array(string(MAX_TEXT), max_items=1000),
        "uncertainties": array(string(MAX_TEXT), max_items=1000),
        "protocol_violations": array(string(MAX_TEXT), max_items=1000),
        "regressions": array(string(MAX_TEXT), max_items=1000),
        "missing_comparisons": array(string(MAX_TEXT), max_items=1000),
        "recommendations": array(string(MAX_TEXT), max_items=1000),
        "observations": array(
            closed(
                {
                    "experiment": string(32),
                    "node": string(32),  # an observation on a Worker's reports ("experiment" is then "")
                    "subcategory": string(32),
                    "observation": string(24),
                    "note": string(MAX_TEXT),
                    "evidence": free_object(),
                    "evidence_redacted": boolean(),
                },
                optional=("node", "evidence", "evidence_redacted"),
            ),
            max_items=10_000,
        ),
        "created_at": TIMESTAMP,
        "redacted": boolean(),
    }
)


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    return {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()


def _wants_integer(schema: Any) -> bool:
    """Whether a value here can only be an integer (not also any number), in this schema or a branch."""
    if not isinstance(schema, dict):
        return False
    types = _types(schema)
    if "number" in types:
        return False
    branches = [b for key in ("anyOf", "oneOf", "allOf") for b in schema.get(key, ()) if isinstance(b, dict)]
    if any("number" in _types(branch) for branch in branches):
        return False
    return "integer" in types or any(_wants_integer(branch) for branch in branches)


def integers_coerced(schema: Any, value: Any) -> Any:
    """``value`` with every whole float where the schema wants an integer made an ``int`` (5.0 -> 5).

    JSON Schema counts 5.0 as an integer, so validation lets it through; a handler that slices,
    counts or stores it would then fail on a float. Coercing here, before the schema check, gives
    every handler the type its schema promises. Non-whole floats (5.5) stay as they are for the
    schema to refuse, with their path.
    """
    if not isinstance(schema, dict):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and _wants_integer(schema):
        return int(value)
    branches = [b for key in ("anyOf", "oneOf", "allOf") for b in schema.get(key, ()) if isinstance(b, dict)]
    coerced: Any
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        coerced = {key: integers_coerced(properties.get(key, extra), item) for key, item in value.items()}
    elif isinstance(value, list):
        items = schema.get("items")
        coerced = [integers_coerced(items, item) for item in value]
    else:
        return value
    # An object or array under anyOf/oneOf/allOf: each branch that describes it coerces in turn.
    for branch in branches:
        coerced = integers_coerced(branch, coerced)
    return coerced


# A compiled coercion: fn(value, changed) -> value, whole floats made int where the schema wants
# an integer (the same object back when nothing changed); ``changed`` gets an entry per change.
Coercion = Callable[[Any, list[int]], Any]


def integer_coercion(schema: Any) -> Coercion:
    """``integers_coerced(schema, ·)`` for one schema, planned once: only the places where the
    schema can want an integer are visited, and a container is copied only when an item in it
    changes (the caller's value is never changed: a refused call is recorded as it was sent).

    A 1,000-point metric batch has integers only at ``points[*].step``: the plan reads that one
    key of each point, where the general walk rebuilt every dict and looked up every value's
    schema (a third of the call). Subtrees under anyOf/oneOf/allOf keep the general walk.
    """
    return _coercion(schema) or _unchanged


def _unchanged(value: Any, changed: list[int]) -> Any:
    return value


def _coerce_whole(value: Any, changed: list[int]) -> Any:
    if type(value) is float and math.isfinite(value) and value.is_integer():
        changed.append(1)
        return int(value)
    return value


def _coercion(schema: Any) -> Coercion | None:
    """The plan for ``schema``; None where no value below it can be made an integer."""
    if not isinstance(schema, dict):
        return None
    if any(key in schema for key in ("anyOf", "oneOf", "allOf")) or len(_types(schema) - {"null"}) > 1:

        def general(value: Any, changed: list[int]) -> Any:
            changed.append(1)  # not tracked here: the caller then checks the whole value's range
            return integers_coerced(schema, value)

        return general
    if _wants_integer(schema):
        return _coerce_whole
    if "object" in _types(schema) or "properties" in schema or "additionalProperties" in schema:
        properties = schema.get("properties", {})
        planned = {key: plan for key, sub in properties.items() if (plan := _coercion(sub)) is not None}
        extra = _coercion(schema.get("additionalProperties"))
        if not planned and extra is None:
            return None

        def object_(value: Any, changed: list[int]) -> Any:
            if type(value) is not dict:
                return value
            # Copied once an item changes: the caller's value stays as it was sent.
            copy: dict[str, Any] | None = None
            for key, item in value.items():
                plan = planned.get(key) if key in properties else extra
                if plan is not None and (new := plan(item, changed)) is not item:
                    if copy is None:
                        copy = dict(value)
                    copy[key] = new
            return value if copy is None else copy

        return object_
    items = _coercion(schema.get("items"))
    if items is None:
        return None

    def array(value: Any, changed: list[int]) -> Any:
        if type(value) is not list:
            return value
        copy: list[Any] | None = None
        for index, item in enumerate(value):
            if (new := items(item, changed)) is not item:
                if copy is None:
                    copy = list(value)
                copy[index] = new
        return value if copy is None else copy

    return array
