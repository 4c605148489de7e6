"""The evaluator contract, and the built-in evaluators that implement it.

**Contract.** An evaluator is a pure function ``(output, answer) -> bool``: the model's output,
already truncated at the task's stop strings / EOS, and the sample's gold ``answer`` string
(for a code task, a JSON object holding the tests: they stay with the scorer and never reach the
model). Each is registered in ``CONTRACTS`` with the metric it feeds (``accuracy``: the mean of
the per-sample booleans) and its kind. Every adapter (apps/benchmarks/adapters.py: the built-in
HF-generate path, the out-of-process Inspect path) produces one ``{"id", "output", "correct"}``
record per sealed sample through this contract, so evaluations from any adapter are scored,
stored and compared the same way. An Inspect task's own scorer is recorded beside ours, for
reference; ours decides (the sealed copy of this file, hash-verified before every evaluation).

Each evaluator is strict about format on purpose: a model that answers "The answer is 57." to a
minibench item has not learned the task's format, and the benchmark must show that (the catalog's
wrong-format dataset depends on it). ``gsm8k_numeric`` is the exception by design: GSM8K answers
are free text ending in a number, scored as leaderboards do (final number, exact, signed).
No Django imports: the evaluation worker and the tests call these directly.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from apps.benchmarks import sandbox as _sandbox

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


# A signed decimal with optional thousands separators: "-1,234.5", "+7", ".5". A minus sign glued
# to the number counts ("-5" is not "5": a scorer that drops the sign passes wrong answers).
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?![\w])")
_ANSWER_MARK = re.compile(r"(?:####|ANSWER\s*:|answer is)", re.IGNORECASE)


def _numbers(text: str) -> list[Fraction]:
    found = []
    for match in _NUMBER.finditer(text):
        token = match.group(0).replace(",", "")
        if not any(c.isdigit() for c in token):
            continue
        found.append(Fraction(token))
    return found


def gsm8k_gold(answer: str) -> Fraction | None:
    """The gold number of a GSM8K answer: the text after its last ``####``, else its last number."""
    tail = answer.rsplit("####", 1)[-1]
    numbers = _numbers(tail)
    return numbers[-1] if numbers else None


def gsm8k_numeric(output: str, answer: str) -> bool:
    """Exact signed numeric match of the final answer, as GSM8K leaderboards score it.

    The prediction is the first number after the output's last answer mark (``####``,
    ``ANSWER:``, ``answer is``) or, with no mark, the output's last number. It must equal the gold
    number exactly, as a rational (``72`` = ``72.0`` = ``72.00``; ``-5`` ≠ ``5``; ``1,000`` = ``1000``).
    """
    want = gsm8k_gold(answer)
    if want is None:
        return False
    marks = list(_ANSWER_MARK.finditer(output))
    if marks:
        after = _numbers(output[marks[-1].end() :])
        got = after[0] if after else None
    else:
        numbers = _numbers(output)
        got = numbers[-1] if numbers else None
    return got is not None and got == want


def _code_tests(answer: str) -> tuple[str, str, str]:
    spec = json.loads(answer)
    return str(spec.get("prompt", "")), str(spec["test"]), str(spec["entry_point"])


# A fence line: ``` at the start of a line (indent allowed), then an optional language label.
_FENCE = re.compile(r"^[ \t]*```[ \t]*([^\s`]*)[^\n]*$", re.MULTILINE)
_PYTHON_LABELS = frozenset({"python", "python3", "py"})


def fenced_code(output: str) -> str | None:
    """The fenced code in a model's output, as Inspect's humaneval finds it; None without a fence.

    The first block fenced as ```python (``python3``, ``py``; any case), else the first plain ```
    block. A block ends at the next fence line; a ```python block never closed runs to the end of
    the output. Line endings are normalised to ``\n``.
    """
    text = output.replace("\r\n", "\n")
    fences = list(_FENCE.finditer(text))
    labelled: list[str] = []
    plain: list[str] = []
    index = 0
    while index < len(fences):
        opener = fences[index]
        label = opener.group(1).lower()
        closer = fences[index + 1] if index + 1 < len(fences) else None
        body = text[opener.end() + 1 : closer.start() if closer else len(text)]
        if body.strip() and label in _PYTHON_LABELS:
            labelled.append(body)
        elif body.strip() and not label and closer is not None:
            plain.append(body)
        # A closer that carries a label opens the next block itself.
        index += 1 if closer is not None and closer.group(1) else 2
    blocks = labelled or plain
    return blocks[0] if blocks else None


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", code, re.MULTILINE) is not None


def code_program(prompt: str, output: str, entry_point: str) -> str:
    """The program a completion stands for: the prompt, then the code extracted from the output.

    Unfenced output continues the prompt as HumanEval's completions do. A fenced block that
    defines the entry point at top level follows the prompt whole (its function replaces the
    prompt's stub, and its imports and helpers stay); an indented block is the stub's body; any
    other block gives the text after its first ``:\n    `` (the body of its first function), as
    Inspect's humaneval does with every block.
    """
    code = fenced_code(output)
    if code is None:
        return f"{prompt}{output}"
    if _defines(code, entry_point):
        # The prompt's stub needs a body of its own only when it ends at the signature.
        stub = prompt if _compiles(prompt) else f"{prompt}    pass\n"
        return f"{stub}\n{code}"
    if code[:1] in (" ", "\t"):
        return f"{prompt}{code}"
    body = code.find(":\n    ")
    return f"{prompt}{code[body + 2 :] if body >= 0 else code}"


def _compiles(source: str) -> bool:
    try:
        compile(source, "<prompt>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def code_tests(output: str, answer: str) -> bool:
    """HumanEval-style: the hidden tests, in their own sandbox, pass against the model's completion.

    ``answer`` is ``{"prompt", "test", "entry_point"}`` (HumanEval's own fields). The completion
    (``code_program``: fenced code as Inspect's humaneval extracts it) runs in one sandbox and
    answers calls of ``entry_point`` with plain data; ``check(entry_point)`` runs in another and
    compares builtin values there; the sample passes only on the verdict that process writes after
    ``check`` returns (apps/benchmarks/sandbox.py ``run_tests``), never on an exit status.
    """
    try:
        prompt, test, entry_point = _code_tests(answer)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return False
    if not entry_point.isidentifier():
        return False
    program = code_program(prompt, output, entry_point)
    return _sandbox.run_tests(program=program, prompt=prompt, test=test, entry_point=entry_point).passed


EVALUATORS: dict[str, Callable[[str, str], bool]] = {
    "exact_match": exact_match,
    "multiple_choice": multiple_choice,
    "json_call": json_call,
    "gsm8k_numeric": gsm8k_numeric,
    "code_tests": code_tests,
}


@dataclass(frozen=True)
class EvaluatorSpec:
    """One evaluator's registration: what it scores and the metric its booleans feed."""

    name: str
    kind: str  # "format" (strict string forms) | "numeric" | "code" (executed in the sandbox)
    metric: str  # how per-sample booleans become the benchmark's score
    answer_format: str
    extraction: str  # what of the model's output is scored, and how


CONTRACTS: dict[str, EvaluatorSpec] = {
    "exact_match": EvaluatorSpec(
        "exact_match", "format", "accuracy", "the gold number or string",
        "the whole output, whitespace and one trailing period aside",
    ),
    "multiple_choice": EvaluatorSpec(
        "multiple_choice", "format", "accuracy", "the gold letter A-D",
        "the output's first character, a letter A-D not followed by another letter",
    ),
    "json_call": EvaluatorSpec(
        "json_call", "format", "accuracy", 'JSON {"name", "arguments"}',
        "the whole output as one JSON object, compared with the gold call exactly",
    ),
    "gsm8k_numeric": EvaluatorSpec(
        "gsm8k_numeric", "numeric", "accuracy", "GSM8K answer text ending '#### N'",
        "the first number after the last '####', 'ANSWER:' or 'answer is', else the last number",
    ),
    "code_tests": EvaluatorSpec(
        "code_tests", "code", "accuracy", 'JSON {"prompt", "test", "entry_point"}',
        "the first ```python (python3, py) fenced block, else the first plain ``` block, else the whole "
        "output as a continuation of the prompt; a fenced function named entry_point replaces the prompt's "
        "stub, an indented block is its body. The tests run in a sandbox of their own against the "
        "completion's return values rebuilt as exact builtin types; the verdict is the one the test "
        "process writes after check() returns, never an exit status",
    ),
}  # fmt: skip


def score(evaluator_name: str, output: str, answer: str) -> bool:
    """Score one output with a named built-in evaluator."""
    try:
        evaluator = EVALUATORS[evaluator_name]
    except KeyError:
        raise ValueError(f"unknown evaluator {evaluator_name!r}; known: {sorted(EVALUATORS)}") from None
    return evaluator(output, answer)
