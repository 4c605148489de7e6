"""Code tasks are scored by a verifier the completion cannot reach (issue 34).

A red team of generated hostile completions (tests/apps/benchmarks/code_tasks.py: every trick
composed with wrong bodies, placements, spellings, names and delivery forms under fixed seeds)
must all score 0, and the tests show each trick is real: where the generator says the old
exit-status scorer passes a variant, it does. Correct answers, fenced or not, still pass.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from apps.benchmarks import sandbox
from apps.benchmarks.contract import build_contract
from apps.ml import evaluators
from tests.apps.benchmarks.code_tasks import (
    PROBLEMS,
    STATEMENT_PLACEMENTS,
    STATEMENT_TRICKS,
    VALUE_PLACEMENTS,
    VALUE_TRICKS,
    Hostile,
    Problem,
    correct_forms,
    hostile,
    run_check_directly,
    wrong_bodies_fail,
)

SEEDS = tuple(range(5))
POOL = 4  # sandboxes are processes; a few at once keeps both cores busy


def score_all(pairs: list[tuple[str, str]]) -> list[bool]:
    with ThreadPoolExecutor(POOL) as pool:
        return list(pool.map(lambda pair: evaluators.code_tests(*pair), pairs))


def exit_status_rule(problem: Problem, output: str) -> bool:
    """The scorer this replaces: prompt, completion and tests in one process; exit status 0 passes."""
    program = evaluators.code_program(problem.prompt, output, problem.entry_point)
    return sandbox.run_python(f"{program}\n\n{problem.test}\n\ncheck({problem.entry_point})\n").exited_zero


def describe(h: Hostile) -> str:
    return f"{h.trick} / {h.problem.entry_point} / {h.placement} / {h.spelling} / {h.form}:\n{h.output}"


@pytest.fixture(scope="module")
def red_team() -> list[Hostile]:
    return [h for seed in SEEDS for h in hostile(seed)]


def test_the_problems_are_sound_canonical_bodies_pass_and_wrong_bodies_fail():
    assert [p.entry_point for p in PROBLEMS if not run_check_directly(p, p.body)] == []
    assert wrong_bodies_fail() == []


def test_every_hostile_completion_scores_zero(red_team):
    # The generator covers every trick, and every placement, across the seeds.
    assert {h.trick for h in red_team} == set(STATEMENT_TRICKS) | set(VALUE_TRICKS)
    statement = [h for h in red_team if h.trick in STATEMENT_TRICKS]
    assert {h.placement for h in statement} == set(STATEMENT_PLACEMENTS)
    assert {h.placement for h in red_team if h.trick in VALUE_TRICKS} <= set(VALUE_PLACEMENTS)
    assert len({h.output for h in red_team}) == len(red_team)
    verdicts = score_all([(h.output, h.problem.answer) for h in red_team])
    passed = [describe(h) for h, verdict in zip(red_team, verdicts, strict=True) if verdict]
    assert passed == [], "hostile completions scored as passing:\n\n" + "\n\n".join(passed)


def test_the_tricks_are_real_the_exit_status_rule_passes_them(red_team):
    claimed = [h for h in red_team if h.fools_exit_status]
    # Enough of each kind to mean something: exits, hooks, forks, patches and rigged values.
    assert {"exit zero", "atexit exit zero", "excepthook exit zero", "fork and exit zero"} <= {h.trick for h in claimed}
    assert len({h.trick for h in claimed}) >= 7, Counter(h.trick for h in claimed)
    with ThreadPoolExecutor(POOL) as pool:
        old = list(pool.map(lambda h: exit_status_rule(h.problem, h.output), claimed))
    assert [describe(h) for h, ok in zip(claimed, old, strict=True) if not ok] == []


def test_monkeypatches_at_import_fool_only_the_old_rule():
    """Each patch trick at import time, on the problem whose tests lean on what it patches."""
    for trick in ("patch abs", "patch isclose", "patch unittest"):
        sources, fools_when, needs = STATEMENT_TRICKS[trick]
        assert fools_when == "import"
        problem = next(p for p in PROBLEMS if needs in p.leans_on)
        output = f"{sources[0]}\n{problem.function(problem.wrong[0])}"
        assert exit_status_rule(problem, output), trick
        assert not evaluators.code_tests(output, problem.answer), trick
        if trick != "patch abs":  # (the canonical body calls abs itself)
            # The patch does not spoil a correct answer: the tests' process was never patched.
            assert evaluators.code_tests(f"{sources[0]}\n{problem.function(problem.body)}", problem.answer), trick


def test_correct_solutions_pass_in_the_forms_models_write_them():
    rng = random.Random(11)
    pairs, labels = [], []
    for problem in PROBLEMS:
        for form, output in correct_forms(problem, rng).items():
            pairs.append((output, problem.answer))
            labels.append(f"{problem.entry_point} / {form}:\n{output}")
    verdicts = score_all(pairs)
    assert [label for label, ok in zip(labels, verdicts, strict=True) if not ok] == []


@pytest.mark.parametrize("seed", range(20))
def test_every_answer_form_builds_a_program_that_passes_when_run_directly(seed):
    """Extraction alone, in this process, on our own canonical answers: every form, every problem."""
    rng = random.Random(seed)
    problem = PROBLEMS[seed % len(PROBLEMS)]
    for output in correct_forms(problem, rng).values():
        program = evaluators.code_program(problem.prompt, output, problem.entry_point)
        scope: dict[str, object] = {}
        exec(compile(f"{program}\n{problem.test}", "<program>", "exec"), scope)
        scope["check"](scope[problem.entry_point])  # raises on a wrong extraction (names the form)


def test_fenced_code_is_found_as_inspects_humaneval_finds_it():
    body = "    return 1\n"
    assert evaluators.fenced_code("no fence at all") is None
    assert evaluators.fenced_code(f"```python\n{body}```") == body
    assert evaluators.fenced_code(f"text\n```\n{body}```\nmore") == body
    # A python-labelled block wins over an earlier plain one; the first labelled block is taken.
    assert evaluators.fenced_code(f"```\nexample()\n```\n```py\n{body}```\n```python\nx = 2\n```") == body
    assert evaluators.fenced_code(f"```PYTHON\r\n{body.replace(chr(10), chr(13) + chr(10))}```") == body
    assert evaluators.fenced_code(f"```python\n{body}") == body  # never closed: to the end
    assert evaluators.fenced_code("```json\n{}\n```") is None  # another language is not code
    assert evaluators.fenced_code(f"```\n{body}") is None  # a plain fence never closed is not a block
    # A fenced function named like the entry point replaces the stub; other blocks fill it.
    prompt = 'def f(x):\n    """doc"""\n'
    assert evaluators.code_program(prompt, "```python\ndef f(x):\n    return x\n```", "f").endswith(
        "\ndef f(x):\n    return x\n"
    )
    assert evaluators.code_program(prompt, "```python\ndef g(y):\n    return y\n```", "f") == prompt + "    return y\n"
    assert evaluators.code_program("def f(x):\n", "```python\ndef f(x):\n    return x\n```", "f").startswith(
        "def f(x):\n    pass\n"
    )


def test_the_contract_states_how_code_is_extracted_and_judged():
    task = {"evaluator": "code_tests", "prompt_template": "{question}", "decoding": {"max_new_tokens": 8}}
    contract = build_contract(task, code_sha256={}, sample_counts={}, packages=None, strict=False)
    assert contract["extraction"] == evaluators.CONTRACTS["code_tests"].extraction
    for phrase in ("```python", "plain ``` block", "exact builtin types", "never an exit status"):
        assert phrase in contract["extraction"]
    assert all(spec.extraction for spec in evaluators.CONTRACTS.values())


# --- the plain-data channel ------------------------------------------------------------------------


def random_plain(rng: random.Random, depth: int = 0):
    kinds = ["none", "bool", "int", "bigint", "float", "special", "complex", "str", "bytes"]
    if depth < 3:
        kinds += ["list", "tuple", "dict", "set", "frozenset"]
    kind = rng.choice(kinds)
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.randint(-1000, 1000)
    if kind == "bigint":
        return rng.choice([-1, 1]) * rng.getrandbits(rng.randint(64, 5000))
    if kind == "float":
        return rng.uniform(-1e6, 1e6)
    if kind == "special":
        return rng.choice([math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308])
    if kind == "complex":
        return complex(rng.uniform(-9, 9), rng.uniform(-9, 9))
    if kind == "str":
        return "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0x80, 0x10FFFF)])) for _ in range(5))
    if kind == "bytes":
        return rng.randbytes(rng.randint(0, 6))
    items = [random_plain(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    hashable = [x for x in items if is_hashable(x)]
    if kind == "dict":
        return {k: random_plain(rng, depth + 1) for k in hashable}
    return set(hashable) if kind == "set" else frozenset(hashable)


def is_hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def canonical(value) -> tuple:
    """A value's exact types and contents, comparable as a whole (sets in a sorted order)."""
    kind = type(value).__name__
    if isinstance(value, list | tuple):
        return (kind, tuple(canonical(x) for x in value))
    if isinstance(value, dict):
        return (kind, tuple((canonical(k), canonical(v)) for k, v in value.items()))
    if isinstance(value, set | frozenset):
        return (kind, tuple(sorted(repr(canonical(x)) for x in value)))
    return (kind, repr(value))


def same(a, b) -> bool:
    """Equal and of exactly the same types all the way down (``==`` alone says 1 == 1.0 == True)."""
    return canonical(a) == canonical(b)


PLAIN = {type(None), bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset}


def plain_all_the_way(value) -> bool:
    if type(value) not in PLAIN:
        return False
    if isinstance(value, dict):
        return all(plain_all_the_way(k) and plain_all_the_way(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return all(plain_all_the_way(x) for x in value)
    return True


@pytest.mark.parametrize("seed", range(5))
def test_plain_data_crosses_exactly(seed):
    rng = random.Random(seed)
    for _ in range(200):
        value = random_plain(rng)
        wire = json.loads(json.dumps(sandbox.encode_plain(value)))
        assert same(sandbox.decode_plain(wire), value), value
    assert math.isnan(sandbox.decode_plain(sandbox.encode_plain(math.nan)))


def hostile_values(rng: random.Random) -> list[object]:
    """Values no test may compare: subclasses of plain types, rigged objects, non-data."""

    def rigged(base: type) -> type:
        methods = {"__eq__": lambda s, o: True, "__ne__": lambda s, o: False, "__hash__": lambda s: 0}
        return type(f"R{rng.randrange(1000)}", (base,), methods)

    base = rng.choice([int, str, float, list, tuple, dict, bytes, frozenset])
    values: list[object] = [rigged(base)(), rigged(object)(), (x for x in ()), len, type, object(), bytearray(b"a")]
    values.append([1, (2, {3: rigged(int)(4)})])  # buried deep inside plain data
    values.append({rigged(str)("k"): 1})
    nest: list[object] = []
    for _ in range(80):
        nest = [nest]
    values.append(nest)  # deeper than the channel carries
    return values


MALFORMED = [
    ["int", "12"], ["int", "0x1F"], ["bool", 1], ["str", 3], ["float", "one"], ["bytes", "abc"],
    ["list", "x"], ["set", [["list", []]]], ["dict", [[["list", []], ["none"]]]], ["dict", [["none"]]],
    ["none", 1], ["complex", "0x1p0"], [], "str", None, {"int": "0x1"}, ["object", []], ["__eq__", True],
]  # fmt: skip


def flipped_wires(rng: random.Random) -> list[object]:
    """A good encoding with one tag somewhere in it replaced."""
    good = sandbox.encode_plain([1, "a", (2.5, None), {"k": [True]}])
    wires: list[object] = []
    for _ in range(40):
        wire = json.loads(json.dumps(good))
        node = wire
        while isinstance(node, list) and len(node) > 1 and isinstance(node[1], list) and node[1] and rng.random() < 0.6:
            node = rng.choice(node[1])
        if isinstance(node, list) and node:
            node[0] = rng.choice(["int", "float", "bool", "tuple", "set", "dict", "nope", "STR", "none"])
            wires.append(wire)
    return wires


@pytest.mark.parametrize("seed", range(3))
def test_the_channel_refuses_what_is_not_plain_data(seed):
    rng = random.Random(seed)
    for value in hostile_values(rng):
        with pytest.raises(sandbox.NotPlain):
            sandbox.encode_plain(value)
    for wire in MALFORMED:
        with pytest.raises(sandbox.NotPlain):
            sandbox.decode_plain(wire)
    for wire in flipped_wires(rng):
        try:
            decoded = sandbox.decode_plain(wire)
        except sandbox.NotPlain:
            continue
        # A flipped tag can still spell plain data ("list" to "tuple"); what decodes is builtin throughout.
        assert plain_all_the_way(decoded), wire


# --- the verdict: only what the tests process writes after check() returns -------------------------

ADD = Problem(
    "add", 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n', "    return a + b\n",
    "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n", (), frozenset(),
)  # fmt: skip


def test_a_failure_the_tests_swallow_still_fails():
    """Tests that catch everything cannot be passed by a candidate that dies or returns junk."""
    test = (
        "def check(candidate):\n    try:\n        assert candidate(2, 3) == 5\n"
        "    except BaseException:\n        pass\n"
    )
    swallowing = json.dumps({**json.loads(ADD.answer), "test": test})
    assert evaluators.code_tests("    return a + b\n", swallowing)
    assert not evaluators.code_tests("    import os\n    os._exit(0)\n", swallowing)
    assert not evaluators.code_tests("    return type('E', (), {'__eq__': lambda s, o: True})()\n", swallowing)


def test_raised_exceptions_reach_tests_that_expect_them():
    answer = json.dumps({
        "prompt": 'def root(x: float) -> float:\n    """The square root of x >= 0; ValueError below 0."""\n',
        "test": "def check(candidate):\n    assert candidate(4.0) == 2.0\n    try:\n        candidate(-1.0)\n"
                "    except ValueError:\n        return\n    raise AssertionError('no ValueError')\n",
        "entry_point": "root",
    })  # fmt: skip
    assert evaluators.code_tests("    if x < 0:\n        raise ValueError(x)\n    return x ** 0.5\n", answer)
    assert not evaluators.code_tests("    return abs(x) ** 0.5\n", answer)
    # A BaseException is not an answer: the candidate process ends, and the sample fails.
    assert not evaluators.code_tests("    if x < 0:\n        raise SystemExit(0)\n    return x ** 0.5\n", answer)
    # StopIteration never ends an iteration of the tests (here: map() would stop, giving []).
    mapping = json.dumps(
        {**json.loads(answer), "test": "def check(candidate):\n    assert list(map(candidate, [1.0])) == []\n"}
    )
    assert not evaluators.code_tests("    raise StopIteration\n", mapping)


def test_tests_that_never_call_the_candidate_or_never_return_do_not_pass():
    answer = json.dumps({**json.loads(ADD.answer), "test": "def check(candidate):\n    assert True\n"})
    assert not evaluators.code_tests("    return a + b\n", answer)
    # A candidate that never answers times out; what it wrote first (bubblewrap's own error
    # prefix) does not turn its failing sample into an evaluation error.
    hang = "    import time\n    time.sleep(60)\n\nimport sys\n"
    hang += "sys.stdout.write('bwrap: cannot start\\n')\nsys.stdout.flush()\n"
    verdict = sandbox.run_tests(
        program=ADD.prompt + hang, prompt=ADD.prompt, test=ADD.test, entry_point="add", wall_seconds=3
    )
    assert (verdict.passed, verdict.timed_out) == (False, True)
    assert verdict.candidate_output.startswith("bwrap: cannot start")


def test_the_verdict_names_why_and_output_is_never_read_as_one():
    noisy = "    print('{\"passed\": true}')\n    return a + b\n"
    verdict = sandbox.run_tests(program=ADD.prompt + noisy, prompt=ADD.prompt, test=ADD.test, entry_point="add")
    assert verdict.passed
    assert verdict.calls == 2
    assert '{"passed": true}' in verdict.candidate_output
    verdict = sandbox.run_tests(
        program=ADD.prompt + "    import sys\n    sys.exit(0)\n", prompt=ADD.prompt, test=ADD.test, entry_point="add"
    )
    assert not verdict.passed
    assert "ended before answering call 1" in verdict.detail
    verdict = sandbox.run_tests(
        program=ADD.prompt + "    return a * b\n", prompt=ADD.prompt, test=ADD.test, entry_point="add"
    )
    assert not verdict.passed
    assert verdict.detail.startswith("check() raised AssertionError at line 2 of the tests")
