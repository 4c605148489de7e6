"""Values that JSON can carry but no record can hold: find them, name their path, store them safely.

Python's JSON decoder accepts lone surrogates (``"\\ud800"``), NUL characters, the bare tokens
``NaN``/``Infinity``/``-Infinity`` and overflowing numbers (``1e999`` is infinity). None of them
survives the way to a record: UTF-8 cannot encode a lone surrogate (so hashing and the database
driver raise), PostgreSQL text and JSONB refuse NUL, and a strict JSON encoder refuses non-finite
numbers. Left in, they turn a refusal into a crash and the audit record is lost with it.

Two uses, one walk:

- :func:`first_bad_value` finds the first such value (or nesting beyond :data:`MAX_DEPTH`) and
  its path, so tool arguments and data rows are refused before anything runs or is stored;
- :func:`storable` makes any value recordable (escapes instead of refusing), so the record of a
  refused request can always be written.

A third, with a different rule on purpose: :func:`json_safe` is for values the system measured
itself (a job's metrics and result). A diverged loss is data, so a non-finite number becomes
``None`` (JSON null: a chart skips it, a number stays a number or nothing) where ``storable``
writes it as a string (evidence of what a refused request sent); measured values need no escaping.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

# No tool schema or data row is nearly this deep; deeper input is refused, not walked.
MAX_DEPTH = 64
# Lone surrogates (UTF-8 cannot encode them) and NUL (PostgreSQL cannot store it).
_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_KEY_SHOWN = 64
TOO_DEEP = f"[nested deeper than {MAX_DEPTH} levels]"


class Constant:
    """A bare ``NaN``/``Infinity``/``-Infinity`` token, kept by :func:`loads` so its path can be named."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __repr__(self) -> str:
        return self.token


def loads(text: str) -> Any:
    """``json.loads`` that keeps non-standard constants as :class:`Constant` instead of floats."""
    return json.loads(text, parse_constant=Constant)


def escape_text(text: str) -> str:
    """The text with each lone surrogate and NUL written as its JSON escape (``\\ud800``, ``\\u0000``)."""
    return _BAD_CHARS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def json_path(parts: tuple[Any, ...] | list[Any]) -> str:
    """JSONPath of a value: ``$.train.hyperparameters.lr``, ``$.points[3]``, ``$['odd key']``.

    Keys are escaped and shortened, so the path itself is always safe to print and to store.
    """
    out = ["$"]
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
            continue
        key = str(part)
        if len(key) > _MAX_KEY_SHOWN:
            key = key[:_MAX_KEY_SHOWN] + "..."
        if _IDENTIFIER.match(key):
            out.append(f".{key}")
        else:
            # As a JSON string; ASCII-escaped when it holds a lone surrogate, so it prints as sent.
            out.append("[" + json.dumps(key, ensure_ascii=bool(_BAD_CHARS.search(key))) + "]")
    return "".join(out)


def json_pointer(parts: tuple[Any, ...] | list[Any]) -> str:
    """RFC 6901 pointer of a value (``/train/hyperparameters/lr``), escaped like :func:`json_path`."""
    escaped = (escape_text(str(p)).replace("~", "~0").replace("/", "~1") for p in parts)
    return "/" + "/".join(escaped) if parts else "/"


@dataclass(frozen=True)
class BadValue:
    """The first value that cannot be kept, where it is, and what to send instead."""

    parts: tuple[Any, ...]
    rule: str  # lone_surrogate, nul_character, non_finite_number, too_deep
    problem: str

    @property
    def path(self) -> str:
        return json_path(self.parts)

    @property
    def pointer(self) -> str:
        return json_pointer(self.parts)

    @property
    def message(self) -> str:
        return f"{self.path}: {self.problem}"


def _text_problem(text: str, what: str) -> tuple[str, str] | None:
    match = _BAD_CHARS.search(text)
    if match is None:
        return None
    if match.group() == "\x00":
        return "nul_character", f"{what} contains a NUL character (\\u0000) at position {match.start()}; remove it."
    return (
        "lone_surrogate",
        f"{what} contains a lone surrogate (\\u{ord(match.group()):04x}) at position {match.start()}; "
        "send valid Unicode (a surrogate only as half of an escaped pair).",
    )


def first_bad_value(value: Any, *, max_depth: int = MAX_DEPTH) -> BadValue | None:
    """The first lone surrogate, NUL, non-finite number or too-deep nesting in ``value``, or None.

    The outermost object or array is level 1; a value nested in more than ``max_depth`` objects
    and arrays is refused without walking further.
    """
    return _walk(value, (), 0, max_depth)


def _walk(value: Any, parts: tuple[Any, ...], depth: int, max_depth: int) -> BadValue | None:
    if isinstance(value, str):
        found = _text_problem(value, "the string")
        return BadValue(parts, *found) if found else None
    if isinstance(value, Constant):
        return BadValue(parts, "non_finite_number", f"{value.token} is not a JSON number; send a finite number.")
    if isinstance(value, float) and not math.isfinite(value):  # 1e999 parses as infinity
        return BadValue(parts, "non_finite_number", "not a finite number; send a number within double range.")
    if not isinstance(value, dict | list):
        return None
    if depth + 1 > max_depth:
        return BadValue(parts, "too_deep", f"nesting deeper than {max_depth} levels; flatten the value.")
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        if isinstance(key, str):
            found = _text_problem(key, "the key")
            if found:
                return BadValue((*parts, key), *found)
        bad = _walk(item, (*parts, key), depth + 1, max_depth)
        if bad is not None:
            return bad
    return None


# What, in JSON text, can parse into a NUL or a lone surrogate: the characters themselves (a lone
# surrogate also comes from invalid UTF-8 decoded with surrogateescape) or their \\u escapes. An
# escaped surrogate pair (an emoji) or an escaped backslash before "u" matches too: a false
# alarm only costs the full walk.
_MAYBE_BAD_TEXT = re.compile(r"[\x00\ud800-\udfff]|\\u(?:0000|[dD][89a-fA-F])")


def text_may_hold_bad_chars(text: str) -> bool:
    """False when no string parsed from the JSON ``text`` can hold a NUL or a lone surrogate."""
    return _MAYBE_BAD_TEXT.search(text) is not None


def plainly_clean(value: Any, *, check_strings: bool = True, max_int: int, max_depth: int = MAX_DEPTH) -> bool:
    """A quick True when ``value`` certainly holds nothing :func:`first_bad_value` refuses and no
    integer beyond ``max_int``; False means "walk it properly" (first_bad_value names the path).

    One pass that only looks at types (and at strings when ``check_strings``: a caller whose text
    passed :func:`text_may_hold_bad_chars` leaves them out), where the full checks walked a
    1,000-point batch three times building paths: most of that call's CPU.
    """
    return _plain_items((value,), 0, check_strings, max_int, max_depth)


def _plain_items(items: Any, level: int, strings: bool, max_int: int, max_depth: int) -> bool:
    """Whether every one of ``items`` (values nested in ``level`` objects and arrays) is plainly clean."""
    for item in items:
        kind = type(item)
        if kind is dict:
            if level >= max_depth or (strings and any(type(key) is not str or _BAD_CHARS.search(key) for key in item)):
                return False
            if not _plain_items(item.values(), level + 1, strings, max_int, max_depth):
                return False
        elif kind is list:
            if level >= max_depth or not _plain_items(item, level + 1, strings, max_int, max_depth):
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind is int:
            if not -max_int <= item <= max_int:
                return False
        elif kind is str:
            if strings and _BAD_CHARS.search(item):
                return False
        elif item is not None and kind is not bool:
            return False  # anything else (a NaN token's Constant): the full walk
    return True


def json_safe(value: Any) -> Any:
    """NaN and infinities as None, through dicts, lists and tuples (the module docstring says why
    not :func:`storable`): JSON, PostgreSQL's included, has no spelling for them, so storing one
    would fail the whole report."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def storable(value: Any, *, max_depth: int = MAX_DEPTH) -> Any:
    """A copy of ``value`` that UTF-8, PostgreSQL JSONB and a strict JSON encoder all accept.

    For records of refused input, never for input that is acted on: lone surrogates and NUL are
    written as their escapes, non-finite numbers as strings (``"inf"``, ``"NaN"``), keys as
    strings, anything nested deeper than ``max_depth`` as a marker. Clean values come back equal.
    """
    return _storable(value, 0, max_depth)


def _storable(value: Any, depth: int, max_depth: int) -> Any:
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, Constant):
        return value.token
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict | list | tuple):
        if depth + 1 > max_depth:
            return TOO_DEEP
        if isinstance(value, dict):
            return {escape_text(str(k)): _storable(v, depth + 1, max_depth) for k, v in value.items()}
        return [_storable(v, depth + 1, max_depth) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return escape_text(str(value))  # what canonical_json's default=str would write
