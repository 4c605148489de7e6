"""Built-in evaluators: pure functions from (model output, gold answer) to correct/incorrect.

Outputs arrive already truncated at the task's stop strings / EOS. Each evaluator is strict about
format on purpose: a model that answers "The answer is 57." has not learned the task's format,
and the benchmark must show that (the catalog's wrong-format dataset depends on it).
No Django imports: the evaluation worker and the tests call these directly.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

_LETTER = re.compile(r"[A-D]")


def _parse_number(text: str) -> float | None:
    text = text.strip().removesuffix(".").replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def exact_match(output: str, answer: str) -> bool:
    """The whole output (whitespace and one trailing period aside) is the gold number."""
    got, want = _parse_number(output), _parse_number(answer)
    if got is None or want is None:
        # Non-numeric gold: fall back to exact string equality.
        return output.strip() == answer.strip()
    return got == want


def multiple_choice(output: str, answer: str) -> bool:
    """The first letter A-D in the output is the gold letter; a first letter elsewhere is wrong."""
    stripped = output.strip()
    if not stripped or not _LETTER.fullmatch(stripped[0]):
        return False
    # "B" and "B)" pass; "Banana" does not, as B is then not an answer letter.
    return stripped[0] == answer.strip()[:1] and (len(stripped) == 1 or not stripped[1].isalpha())


def _parse_call(text: str) -> tuple[str, dict[str, Any]] | None:
    try:
        call = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return call["name"], arguments


def json_call(output: str, answer: str) -> bool:
    """The output parses as {"name", "arguments"} with the gold name and exactly equal arguments."""
    got, want = _parse_call(output.strip()), _parse_call(answer)
    return got is not None and want is not None and got == want


EVALUATORS: dict[str, Callable[[str, str], bool]] = {
    "exact_match": exact_match,
    "multiple_choice": multiple_choice,
    "json_call": json_call,
}


def score(evaluator_name: str, output: str, answer: str) -> bool:
    """Score one output with a named built-in evaluator."""
    try:
        evaluator = EVALUATORS[evaluator_name]
    except KeyError:
        raise ValueError(f"unknown evaluator {evaluator_name!r}; known: {sorted(EVALUATORS)}") from None
    return evaluator(output, answer)
