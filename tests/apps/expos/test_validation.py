"""The compiled schema check (fastjsonschema) is only a shortcut to "valid": never laxer than jsonschema.

apps.expos.views accepts a body at once when the compiled check passes and asks jsonschema
otherwise. So for every tool, every instance the compiled check passes must be valid for
jsonschema too. Checked here on near-valid instances: each tool's schema filled in (every
optional property too), then every value in it replaced, one at a time, by awkward ones —
a bool for a number, 1.0 for an integer, a uuid without hyphens, over-long strings, nulls.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from apps.expos.registry import load_all
from apps.expos.schemas import REFUSAL_KEY
from apps.expos.views import _passes_compiled

AWKWARD: list[Any] = [
    True,
    False,
    None,
    0,
    -1,
    1.0,
    1.5,
    2**40,
    "",
    "x",
    "x" * 40_001,
    "exp_0001",
    "worker_0002",
    "12345678123412341234123456789012",  # a uuid without its hyphens
    "12345678-1234-1234-1234-123456789012",
    "{12345678-1234-1234-1234-123456789012}",
    "2026-11-29T18:00:00+00:00",
    "yesterday",
    [],
    [1],
    {},
    {"unexpected": 1},
]


def _forbidden(negated: dict[str, Any]) -> set[str]:
    names = set(negated.get("required", []))
    for branch in negated.get("anyOf", []):
        names |= set(branch.get("required", []))
    return names


def _sample(schema: dict[str, Any]) -> Any:
    """One instance meant to be valid, with every optional property present."""
    if (
        REFUSAL_KEY in schema and "properties" in schema
    ):  # alternatives: every property, less those the first fitting one forbids
        full = {name: _sample(sub) for name, sub in schema.get("properties", {}).items()}
        for branch in schema.get("oneOf", schema.get("anyOf", [])):
            forbidden = _forbidden(branch.get("not", {}))
            candidate = {name: value for name, value in full.items() if name not in forbidden}
            if jsonschema.Draft202012Validator(schema).is_valid(candidate):
                return candidate
        return full
    if "oneOf" in schema:
        return _sample(schema["oneOf"][0])
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next(k for k in kind if k != "null")
    if kind == "object":
        return {name: _sample(sub) for name, sub in schema.get("properties", {}).items()}
    if kind == "array":
        return [_sample(schema["items"])] * max(1, schema.get("minItems", 1))
    if kind in ("integer", "number"):
        if "exclusiveMinimum" in schema:  # a learning rate: above its bound, within the maximum
            low = schema["exclusiveMinimum"]
            return low + 1 if kind == "integer" else (low + schema.get("maximum", low + 2)) / 2
        return schema.get("minimum", 0)
    if kind == "boolean":
        return True
    if kind == "string":
        if schema.get("format") == "uuid":
            return "12345678-1234-1234-1234-123456789012"
        if schema.get("format") == "date-time":
            return "2026-11-29T18:00:00+00:00"
        pattern = schema.get("pattern", "")
        for candidate in ("exp_0001", "worker_0001", "reviewer_0001", "loss", "a" * max(1, schema.get("minLength", 1))):
            if not pattern or jsonschema.Draft202012Validator({"pattern": pattern}).is_valid(candidate):
                return candidate
        return "a"
    return {}


def _variants(value: Any) -> Any:
    """The instance with one value (at any depth, the whole included) replaced by an awkward one."""
    yield from AWKWARD
    if isinstance(value, dict):
        for key, item in value.items():
            for variant in _variants(item):
                yield {**value, key: variant}
        yield {**value, "undeclared": 1}
    elif isinstance(value, list) and value:
        for variant in _variants(value[0]):
            yield [variant, *value[1:]]


@pytest.mark.parametrize("which", ["input", "output"])
def test_the_compiled_check_never_passes_what_jsonschema_refuses(which):
    checked = 0
    laxer = []
    for name, tool in sorted(load_all().items()):
        schema = tool.input_schema if which == "input" else tool.output_schema
        validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
        for instance in _variants(_sample(schema)):
            checked += 1
            if _passes_compiled(tool, which, instance) and not validator.is_valid(instance):
                laxer.append(f"{name}: {str(instance)[:200]}")
    assert checked > 5_000
    assert not laxer, "\n".join(laxer[:20])


def test_the_compiled_check_passes_the_valid_samples_of_most_tools():
    """A shortcut that never fires would be no shortcut: valid bodies take it."""
    tools = load_all()
    passed = [n for n, t in tools.items() if _passes_compiled(t, "input", _sample(t.input_schema))]
    valid = [
        n
        for n, t in tools.items()
        if jsonschema.Draft202012Validator(t.input_schema, format_checker=jsonschema.FormatChecker()).is_valid(
            _sample(t.input_schema)
        )
    ]
    assert len(valid) > 40
    assert set(valid) <= set(passed)


def test_the_compiled_check_never_fills_in_defaults():
    tool = load_all()["experiment_metrics_read"]
    args = {"experiment": "exp_0001", "key": "loss"}
    assert _passes_compiled(tool, "input", args)
    assert args == {"experiment": "exp_0001", "key": "loss"}  # no "limit" added: the record is the caller's
