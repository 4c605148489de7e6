"""Built-in evaluators on planted outputs, including the near misses they must reject."""

from __future__ import annotations

import pytest

from apps.ml.evaluators import score


@pytest.mark.parametrize(
    ("output", "answer", "expected"),
    [
        ("57", "57", True),
        (" 57 ", "57", True),
        ("57.", "57", True),
        ("57.0", "57", True),
        ("1,024", "1024", True),
        ("58", "57", False),
        ("The answer is 57.", "57", False),  # right number, wrong format
        ("5757", "57", False),  # a model that never stops
        ("57 57", "57", False),
        ("", "57", False),
        ("nan", "57", False),
    ],
)
def test_exact_match(output: str, answer: str, expected: bool) -> None:
    assert score("exact_match", output, answer) is expected


@pytest.mark.parametrize(
    ("output", "answer", "expected"),
    [
        ("B", "B", True),
        (" B", "B", True),
        ("B) apple", "B", True),
        ("B.", "B", True),
        ("C", "B", False),
        ("b", "B", False),
        ("Banana", "B", False),  # B here is not an answer letter
        ("The answer is B", "B", False),
        ("", "B", False),
    ],
)
def test_multiple_choice(output: str, answer: str, expected: bool) -> None:
    assert score("multiple_choice", output, answer) is expected


GOLD_CALL = '{"name":"convert","arguments":{"amount":12,"from":"USD","to":"EUR"}}'


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (GOLD_CALL, True),
        ('{"name": "convert", "arguments": {"to": "EUR", "from": "USD", "amount": 12}}', True),  # order, spaces
        (' {"name":"convert","arguments":{"amount":12.0,"from":"USD","to":"EUR"}}', True),
        ('{"name":"convert","arguments":{"amount":13,"from":"USD","to":"EUR"}}', False),
        ('{"name":"convert","arguments":{"amount":12,"from":"USD"}}', False),  # missing argument
        ('{"name":"convert","arguments":{"amount":12,"from":"USD","to":"EUR","x":1}}', False),  # extra
        ('{"name":"get_weather","arguments":{"amount":12,"from":"USD","to":"EUR"}}', False),
        ("convert(amount=12, from='USD', to='EUR')", False),
        ('{"name":"convert","arguments":{"amount":12', False),  # truncated
        ('["convert"]', False),
    ],
)
def test_json_call(output: str, expected: bool) -> None:
    assert score("json_call", output, GOLD_CALL) is expected


def test_unknown_evaluator_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown evaluator"):
        score("bleu", "a", "a")
