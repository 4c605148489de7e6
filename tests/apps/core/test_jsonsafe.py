"""The quick check of tool arguments never calls clean what the full walk refuses.

``plainly_clean`` lets the common request skip ``first_bad_value``'s path-building walk; it may
send a clean value to that walk (a false alarm costs time), never the other way. Each class of
bad value is generated in several places of a body (STYLE 31c): at the top, in a list, deep in
objects, as a key; and ``text_may_hold_bad_chars`` must flag every JSON text that parses into a
NUL or a lone surrogate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from apps.core.jsonsafe import MAX_DEPTH, first_bad_value, loads, plainly_clean, text_may_hold_bad_chars

MAX_INT = 2**63 - 1
BAD_STRINGS = ["\x00", "a\x00", "\ud800", "x\udfff", "\udbff\ud800", "\udced\udca0"]
BAD_NUMBERS = [float("nan"), float("inf"), float("-inf")]
HUGE = [2**63, -(2**63), 10**30]


def nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def placed(bad: Any) -> Iterator[Any]:
    yield {"a": bad}
    yield {"points": [{"key": "loss", "step": 1, "value": 0.5}, {"key": "k", "step": 2, "value": bad}]}
    yield {"x": {"y": {"z": [1, 2, [bad]]}}}
    yield [bad]


def bad_bodies() -> Iterator[Any]:
    for text in BAD_STRINGS:
        yield from placed(text)
        yield {text: 1}
        yield {"outer": [{text: "v"}]}
    for number in BAD_NUMBERS:
        yield from placed(number)
    yield from placed(loads("NaN"))  # a bare token, kept as a Constant
    yield nested(MAX_DEPTH + 1)
    yield {"deep": nested(MAX_DEPTH)}


@pytest.mark.parametrize("body", list(bad_bodies()), ids=repr)
def test_what_the_full_walk_refuses_is_never_plainly_clean(body):
    assert first_bad_value(body) is not None
    assert not plainly_clean(body, max_int=MAX_INT)


@pytest.mark.parametrize("huge", HUGE)
def test_an_integer_beyond_the_limit_is_never_plainly_clean(huge):
    for body in placed(huge):
        assert not plainly_clean(body, max_int=MAX_INT)
        assert not plainly_clean(body, check_strings=False, max_int=MAX_INT)


def test_a_clean_body_is_plainly_clean_at_the_depth_limit_too():
    clean = {"points": [{"key": "lôss ✓", "step": MAX_INT, "value": -1e308}], "ok": [True, None, "", 0.0]}
    assert plainly_clean(clean, max_int=MAX_INT)
    assert first_bad_value(nested(MAX_DEPTH)) is None
    assert plainly_clean(nested(MAX_DEPTH), max_int=MAX_INT)


@pytest.mark.parametrize("text", BAD_STRINGS)
def test_every_json_text_holding_a_bad_string_is_flagged(text):
    for ensure_ascii in (True, False):  # escaped (\u0000, \ud800) or raw
        body = json.dumps({"a": [text], text: 1}, ensure_ascii=ensure_ascii)
        assert text_may_hold_bad_chars(body), body
    # Invalid UTF-8, as the view decodes it (surrogateescape), is flagged too.
    assert text_may_hold_bad_chars(b'{"a": "\xed\xa0\x80"}'.decode("utf-8", errors="surrogateescape"))


def test_escapes_of_other_characters_are_not_flagged():
    assert not text_may_hold_bad_chars(json.dumps({"a": "é\u2028\t", "b": "\\u00e9"}))
    assert not text_may_hold_bad_chars(r'{"a": "\u0041\u00e9\uE000"}')
