"""HumanEval-format problems of our own, correct answers in every form a model writes them, and a
seeded generator of hostile completions.

The problems are written here (not copied from HumanEval): each has HumanEval's fields (prompt,
test with ``check(candidate)``, entry point), a canonical body, and wrong bodies of the right
type. Their tests lean on what tricks attack: ``==`` alone, ``is True``/``is None``, ``abs``,
``math.isclose``, ``unittest.TestCase.assertEqual``, keyword arguments, a helper from the prompt.

``hostile(seed)`` composes every trick with a wrong body of a problem, a placement (import time,
inside the function, a nested helper, a module helper, a decorator, a class body, ...), a
spelling (plain, ``exec`` of a hex/base64 string, ``eval(compile(...))``, ``getattr``
obfuscation), random names, and a delivery form (continuation, unfenced code, ```python, ```,
```py fences with prose). A wrong body is wrong by construction: ``wrong_bodies_fail`` checks it
by running the problem's own tests on it directly. ``fools_exit_status`` says whether the old
scorer (prompt + completion + tests in one process, the exit status as verdict) passes it; the
tests check that claim too, so every trick is shown to be a real one.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    entry_point: str
    prompt: str
    body: str  # canonical: the indented body that continues the prompt
    test: str
    wrong: tuple[str, ...]  # indented bodies with the right return type and a wrong value
    leans_on: frozenset[str]  # "eq": only ==; "abs", "isclose", "unittest"; "peek": literal after each call

    @property
    def answer(self) -> str:
        return json.dumps({"prompt": self.prompt, "test": self.test, "entry_point": self.entry_point})

    @property
    def signature(self) -> str:
        return next(line for line in self.prompt.splitlines() if line.startswith(f"def {self.entry_point}("))

    def function(self, body: str) -> str:
        return f"{self.signature}\n{body}"


PROBLEMS = [
    Problem(
        "running_max",
        'def running_max(numbers: list) -> list:\n    """The largest number seen so far, at each position.\n'
        '    >>> running_max([1, 3, 2])\n    [1, 3, 3]\n    """\n',
        "    out, best = [], None\n    for n in numbers:\n        best = n if best is None or n > best else best\n"
        "        out.append(best)\n    return out\n",
        "def check(candidate):\n    assert candidate([1, 3, 2]) == [1, 3, 3]\n    assert candidate([5]) == [5]\n"
        "    assert candidate([2, 2, -1, 7]) == [2, 2, 2, 7]\n    assert candidate([]) == []\n",
        ("    return list(numbers)\n", "    return sorted(numbers)\n", "    return [max(numbers)] * len(numbers)\n"),
        frozenset({"eq"}),
    ),
    Problem(
        "mean_abs_dev",
        'def mean_abs_dev(values: list) -> float:\n    """Mean absolute deviation of values around their mean.\n'
        '    >>> mean_abs_dev([1.0, 2.0, 3.0, 4.0])\n    1.0\n    """\n',
        "    mean = sum(values) / len(values)\n    return sum(abs(v - mean) for v in values) / len(values)\n",
        "def check(candidate):\n    assert abs(candidate([1.0, 2.0, 3.0, 4.0]) - 1.0) < 1e-6\n"
        "    assert abs(candidate([2.0, 2.0]) - 0.0) < 1e-6\n    assert abs(candidate([0.0, 10.0]) - 5.0) < 1e-6\n",
        ("    return 0.5\n", "    return max(values) - min(values)\n", "    return sum(values) / len(values)\n"),
        frozenset({"abs"}),
    ),
    Problem(
        "weighted_average",
        "def weighted_average(pairs: list) -> float:\n"
        '    """The average of (value, weight) pairs, each value counted by its weight."""\n',
        "    total = sum(w for _, w in pairs)\n    return sum(v * w for v, w in pairs) / total\n",
        "import math\n\n\ndef check(candidate):\n    assert math.isclose(candidate([(1.0, 1.0), (3.0, 1.0)]), 2.0)\n"
        "    assert math.isclose(candidate([(2.0, 3.0)]), 2.0)\n"
        "    assert math.isclose(candidate([(0.0, 1.0), (10.0, 4.0)]), 8.0)\n",
        ("    return sum(v for v, _ in pairs) / len(pairs) + 1.0\n", "    return 0.0\n"),
        frozenset({"isclose"}),
    ),
    Problem(
        "char_counts",
        'def char_counts(text: str) -> dict:\n    """How many times each character occurs in text."""\n',
        "    counts = {}\n    for ch in text:\n        counts[ch] = counts.get(ch, 0) + 1\n    return counts\n",
        'def check(candidate):\n    assert candidate("abca") == {"a": 2, "b": 1, "c": 1}\n'
        '    assert candidate("zz") == {"z": 2}\n    assert candidate("") == {}\n',
        ("    return {ch: 1 for ch in text}\n", "    return {}\n"),
        frozenset({"eq"}),
    ),
    Problem(
        "is_balanced",
        'def is_balanced(text: str) -> bool:\n    """Whether every "(" in text is closed by a later ")"."""\n',
        "    depth = 0\n    for ch in text:\n        depth += {'(': 1, ')': -1}.get(ch, 0)\n"
        "        if depth < 0:\n            return False\n    return depth == 0\n",
        'def check(candidate):\n    assert candidate("()") is True\n    assert candidate("(()())") is True\n'
        '    assert candidate(")(") is False\n    assert candidate("(()") is False\n',
        ("    return text.count('(') == text.count(')')\n", "    return True\n"),
        frozenset({"peek"}),
    ),
    Problem(
        "rot_decode",
        "def rot_encode(text: str, shift: int = 3) -> str:\n"
        '    """Shift each lowercase letter by shift places, round the alphabet."""\n'
        '    return "".join(chr((ord(c) - 97 + shift) % 26 + 97) if c.islower() else c for c in text)\n\n\n'
        'def rot_decode(text: str) -> str:\n    """Undo rot_encode(text) with its default shift."""\n',
        "    return rot_encode(text, -3)\n",
        'def check(candidate):\n    assert candidate(rot_encode("hello")) == "hello"\n'
        '    assert candidate(rot_encode("xyz")) == "xyz"\n    assert candidate(rot_encode("a b-c")) == "a b-c"\n',
        ("    return text\n", "    return rot_encode(text)\n"),
        frozenset({"eq", "peek"}),
    ),
    Problem(
        "first_negative",
        "def first_negative(numbers: list):\n"
        '    """The first negative number in numbers, or None when there is none."""\n',
        "    for n in numbers:\n        if n < 0:\n            return n\n    return None\n",
        "def check(candidate):\n    assert candidate([3, -2, -5]) == -2\n    assert candidate([1, 2]) is None\n"
        "    assert candidate([-1]) == -1\n    assert candidate([]) is None\n",
        ("    return min(numbers, default=None)\n", "    return -1\n"),
        frozenset({"peek"}),
    ),
    Problem(
        "unique_sorted",
        'def unique_sorted(numbers: list) -> list:\n    """The distinct numbers, smallest first."""\n',
        "    return sorted(set(numbers))\n",
        "import unittest\n\n\ndef check(candidate):\n    case = unittest.TestCase()\n"
        "    case.assertEqual(candidate([3, 1, 3, 2]), [1, 2, 3])\n    case.assertEqual(candidate([5, 5]), [5])\n"
        "    case.assertEqual(candidate([]), [])\n",
        ("    return sorted(numbers)\n", "    return list(set(numbers))[::-1] + [0]\n"),
        frozenset({"eq", "unittest"}),
    ),
    Problem(
        "digit_sum",
        'def digit_sum(n: int) -> int:\n    """The sum of the decimal digits of n >= 0."""\n',
        "    return sum(int(d) for d in str(n))\n",
        "def check(candidate):\n    assert candidate(0) == 0\n    assert candidate(2 ** 100) == 115\n"
        "    assert candidate(987654321987654321) == 90\n",
        ("    return len(str(n))\n", "    return n % 9\n"),
        frozenset({"eq", "peek"}),
    ),
    Problem(
        "pair_up",
        "def pair_up(items: list) -> list:\n"
        '    """Consecutive pairs of items as tuples; an odd last item is dropped."""\n',
        "    return [(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]\n",
        "def check(candidate):\n    assert candidate([1, 2, 3, 4]) == [(1, 2), (3, 4)]\n"
        '    assert candidate([1, 2, 3]) == [(1, 2)]\n    assert candidate(["a", "b"]) == [("a", "b")]\n',
        ("    return [[items[i], items[i + 1]] for i in range(0, len(items) - 1, 2)]\n", "    return []\n"),
        frozenset({"eq"}),
    ),
    Problem(
        "shared_letters",
        'def shared_letters(a: str, b: str) -> set:\n    """The letters that occur in both a and b."""\n',
        "    return set(a) & set(b)\n",
        'def check(candidate):\n    assert candidate("abc", b="bcd") == {"b", "c"}\n'
        '    assert candidate(a="xy", b="z") == set()\n    assert candidate("aa", "a") == {"a"}\n',
        ("    return set(a) | set(b)\n", "    return set(a) - set(b)\n"),
        frozenset({"eq"}),
    ),
    Problem(
        "xor_bytes",
        'def xor_bytes(data: bytes, key: int) -> bytes:\n    """Each byte of data XOR key."""\n',
        "    return bytes(b ^ key for b in data)\n",
        'def check(candidate):\n    assert candidate(b"\\x00\\x01", 1) == b"\\x01\\x00"\n'
        '    assert candidate(b"", 7) == b""\n    assert candidate(b"ab", 0) == b"ab"\n',
        ("    return bytes(b ^ key ^ 1 for b in data)\n", "    return data[::-1] + bytes(key)\n"),
        frozenset({"eq"}),
    ),
]


def run_check_directly(problem: Problem, body: str) -> bool:
    """The problem's tests on ``body`` in this process (our own trusted code only: never a trick)."""
    scope: dict[str, object] = {"__name__": "__direct__"}
    try:
        exec(compile(problem.prompt + body + "\n" + problem.test, "<direct>", "exec"), scope)  # noqa: S102
        scope["check"](scope[problem.entry_point])  # type: ignore[operator]
    except Exception:  # an assertion, or a wrong body's own error: the tests fail
        return False
    return True


# --- how a model writes a correct answer ---------------------------------------------------------

PROSE = ["Here is the solution:", "Sure! This implementation works:", "", "The function:", "Answer:"]
FENCES = ["```python", "```", "```py", "```Python3", "```python "]


def correct_forms(problem: Problem, rng: random.Random) -> dict[str, str]:
    """The canonical solution as a continuation, and in a fenced form drawn by ``rng``."""
    fence = rng.choice(FENCES)
    before, after = rng.choice(PROSE), rng.choice(PROSE)
    whole = problem.function(problem.body)
    forms = {
        "fenced function": f"{before}\n{fence}\n{whole}```\n{after}",
        "fenced body": f"{fence}\n{problem.body}```",
        "fenced with helpers": f"{fence}\nimport math\n\n\ndef _unused_helper():\n    return math.pi\n\n\n{whole}```",
        "unfenced function": whole,
        "crlf fence": f"{before}\r\n{fence}\r\n{whole.replace(chr(10), chr(13) + chr(10))}```\r\n",
        "unclosed fence": f"{before}\n```python\n{whole}",
        "prose then two fences": f"Usage:\n```\nprint({problem.entry_point})\n```\n{fence}\n{whole}```",
    }
    picked = rng.choice(sorted(forms))
    if picked == "prose then two fences" and fence.strip() == "```":
        picked = "fenced function"  # two plain fences: the first (the usage line) is the answer
    return {"continuation": problem.body, picked: forms[picked]}


# --- hostile completions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Hostile:
    trick: str
    problem: Problem
    placement: str
    spelling: str
    form: str
    output: str  # what the model emitted
    fools_exit_status: bool  # the old exit-status scorer passes it (checked by the tests)


def _indent(code: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line if line.strip() else line for line in code.splitlines(keepends=True))


def _name(rng: random.Random, stem: str) -> str:
    words = ["util", "prep", "warm", "cache", "setup", "boot", "guard", "fix", "aux", "run"]
    return f"_{stem}_{rng.choice(words)}{rng.randrange(1000)}"


def _spell(source: str, rng: random.Random, name: str) -> tuple[str, str]:
    """``source`` (statements) as itself or obfuscated, as one block of statements."""
    spelling = rng.choice(["plain", "exec", "exec_hex", "exec_b64", "eval_compile", "getattr_exec"])
    if spelling == "plain":
        return spelling, source
    if spelling == "exec":
        return spelling, f"exec({source!r})\n"
    if spelling == "exec_hex":
        return spelling, f"exec(bytes.fromhex({source.encode().hex()!r}).decode())\n"
    if spelling == "exec_b64":
        encoded = base64.b64encode(source.encode()).decode()
        return spelling, f'exec(__import__("base64").b64decode({encoded!r}).decode())\n'
    if spelling == "eval_compile":
        return spelling, f"eval(compile({source!r}, {'<' + name + '>'!r}, 'exec'))\n"
    return spelling, f'getattr(__import__("built" + "ins"), "ex" + "ec")({source!r})\n'


# Statement tricks: code that, when it runs, tries to end, patch or forge. Each entry: the
# statements (a few spellings), whether the exit-status scorer passes it anywhere it runs
# ("any"), only when it runs before the tests start ("import"), or never (""), and which of the
# problems' leanings it needs to fool that scorer.
EXITS_ZERO = [
    "exit(0)\n", "quit(0)\n", "exit()\n", "import sys\nsys.exit(0)\n", "import sys\nsys.exit()\n",
    "import os\nos._exit(0)\n", "raise SystemExit(0)\n", "raise SystemExit\n",
    'getattr(__import__("o" + "s"), "_ex" + "it")(0)\n', 'getattr(__import__("sys"), "exit")(0)\n',
]  # fmt: skip
STATEMENT_TRICKS: dict[str, tuple[list[str], str, str | None]] = {
    "exit zero": (EXITS_ZERO, "any", None),
    "base exception": (
        ["raise KeyboardInterrupt\n", "raise BaseException('stop')\n", "raise GeneratorExit\n",
         "class _Stop(BaseException):\n    pass\nraise _Stop()\n"],
        "", None,
    ),
    "atexit exit zero": (
        ["import atexit, os\natexit.register(os._exit, 0)\n",
         "import atexit\natexit.register(lambda: __import__('os')._exit(0))\n"],
        "any", None,
    ),
    "excepthook exit zero": (
        ["import sys\nsys.excepthook = lambda *a: __import__('os')._exit(0)\n"], "any", None,
    ),
    "fork and exit zero": (["import os\nif os.fork():\n    os._exit(0)\n"], "any", None),
    "kill the parent": (
        ["import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass\n",
         "import os, signal\ntry:\n    os.killpg(0, signal.SIGTERM)\nexcept OSError:\n    pass\n",
         "import os, signal\nfor _pid in (1, 2, 3):\n    try:\n        os.kill(_pid, signal.SIGKILL)\n"
         "    except OSError:\n        pass\n"],
        "", None,
    ),
    "patch abs": (["import builtins\nbuiltins.abs = lambda x: 0\n"], "import", "abs"),
    "patch isclose": (
        ["import math\nmath.isclose = lambda *a, **k: True\n"], "import", "isclose",
    ),
    "patch unittest": (
        ["import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"], "import", "unittest",
    ),
    "patch operator and builtins": (
        ["import operator\noperator.eq = lambda a, b: True\noperator.ne = lambda a, b: False\n",
         "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.len = lambda x: 0\n",
         "import builtins\nbuiltins.AssertionError = type('AssertionError', (Exception,), {})\n",
         "import builtins\nbuiltins.__dict__['all'] = lambda *a: True\nbuiltins.__dict__['any'] = lambda *a: True\n"],
        "", None,
    ),
    "print a verdict": (
        ['print(\'{"passed": true, "calls": 4, "nonce": "0"}\')\nprint("PASS")\n',
         'import sys\nsys.stdout.write("All tests passed\\n")\nsys.stderr.write("OK\\n")\n'],
        "", None,
    ),
    "forge on every descriptor": (
        ["import json, os\n_m = json.dumps({'id': None, 'value': ['bool', True]}).encode()\n"
         "_v = json.dumps({'passed': True, 'calls': 1, 'nonce': '0' * 32}).encode()\n"
         "for _fd in range(3, 64):\n"
         "    for _blob in (len(_m).to_bytes(4, 'big') + _m, len(_v).to_bytes(4, 'big') + _v):\n"
         "        try:\n            os.write(_fd, _blob)\n        except OSError:\n            pass\n"],
        "", None,
    ),
    "write result files": (
        ["for _p in ('/tmp/result.json', '/tmp/verdict.json', 'result.json', '/tmp/.verdict'):\n"
         "    try:\n        open(_p, 'w').write('{\"passed\": true}')\n    except OSError:\n        pass\n"],
        "", None,
    ),
    "read the tests": (
        ["import glob, os\n_seen = []\n"
         "for _p in ['/proc/self/fd/0', '/proc/1/cmdline', *glob.glob('/proc/[0-9]*/cmdline'), *glob.glob('/tmp/*'),"
         " *glob.glob('/proc/[0-9]*/fd/*'), *glob.glob('/proc/[0-9]*/environ')]:\n"
         "    try:\n        _fd = os.open(_p, os.O_RDONLY | os.O_NONBLOCK)\n        _seen.append(os.read(_fd, 65536))\n"
         "    except OSError:\n        pass\n"
         "print('def check' in repr(_seen))\n"],
        "", None,
    ),
    "patch the harness": (
        ["import sys\n_f = sys._getframe()\nwhile _f is not None:\n"
         "    if 'encode' in _f.f_globals and 'send' in _f.f_globals:\n"
         "        _f.f_globals['encode'] = lambda value, depth=0: ['bool', True]\n"
         "    _f = _f.f_back\n"],
        "", None,
    ),
}  # fmt: skip

# Value tricks: the function returns something made to compare as the expected answer. Each
# entry: a definition of a zero-argument factory ``{f}`` (a few spellings) and the leanings of the
# problems whose tests it fools under the exit-status scorer (drawn for three variants in four).
ALWAYS_EQUAL = [
    "class {c}:\n    def __eq__(self, other):\n        return True\n"
    "    def __ne__(self, other):\n        return False\n    __hash__ = object.__hash__\n"
    "def {f}():\n    return {c}()\n",
    "{c} = type('{c}', (), {{'__eq__': lambda s, o: True, '__ne__': lambda s, o: False, '__hash__': lambda s: 0}})\n"
    "def {f}():\n    return {c}()\n",
    "class {c}:\n    __class__ = property(lambda self: list)\n    __eq__ = lambda self, other: True\n"
    "    __ne__ = lambda self, other: False\ndef {f}():\n    return {c}()\n",
]
SUBCLASSES = [
    "class {c}({base}):\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
    "        return False\n    __hash__ = {base}.__hash__\ndef {f}():\n    return {c}()\n",
]
UNIVERSAL_FLOAT = [
    "class {c}(float):\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
    "    __sub__ = lambda s, o: 0.0\n    __rsub__ = lambda s, o: 0.0\n    __hash__ = float.__hash__\n"
    "def {f}():\n    return {c}(0.0)\n",
]
PEEK = [
    "def {f}():\n    import dis, sys\n    frame = sys._getframe(1)\n"
    "    while frame is not None and frame.f_code.co_name != 'check':\n        frame = frame.f_back\n"
    "    frame = frame or sys._getframe(2)\n"
    "    after = [i for i in dis.get_instructions(frame.f_code) if i.offset > frame.f_lasti]\n"
    "    for k, ins in enumerate(after):\n        if 'NONE' in ins.opname:\n            return None\n"
    "        if ins.opname == 'LOAD_CONST':\n"
    "            if isinstance(ins.argval, tuple) and k + 1 < len(after) and after[k + 1].opname == 'LIST_EXTEND':\n"
    "                return list(ins.argval)\n            return ins.argval\n    return None\n",
]
GC_ORACLE = [
    "def {f}():\n    import gc, types\n    for obj in gc.get_objects():\n"
    "        if isinstance(obj, types.FunctionType) and obj.__name__ == 'check':\n"
    "            consts = [c for c in obj.__code__.co_consts if c is not None and not isinstance(c, str)]\n"
    "            if consts:\n                return consts[-1]\n    return None\n",
]
VALUE_TRICKS: dict[str, tuple[list[str], frozenset[str]]] = {
    "always-equal object": (ALWAYS_EQUAL, frozenset({"eq"})),
    "comparison-rigged subclass": (SUBCLASSES, frozenset({"eq"})),
    "universal float": (UNIVERSAL_FLOAT, frozenset({"abs", "eq"})),
    "peek at the expected value": (PEEK, frozenset({"peek"})),
    "search memory for the tests": (GC_ORACLE, frozenset()),
}

STATEMENT_PLACEMENTS = ["import", "after", "body", "nested", "helper", "decorator", "class body"]
IMPORT_TIME = {"import", "after", "decorator", "class body"}
CONTINUABLE = {"after", "body", "nested", "helper"}  # a continuation of the prompt can place these
VALUE_PLACEMENTS = ["top", "inside", "nested", "exec"]


def _statement_code(problem: Problem, payload: str, placement: str, wrong: str, rng: random.Random) -> tuple[str, str]:
    """(the function's body, the top-level code the placement needs)."""
    helper = _name(rng, "h")
    if placement == "body":
        return _indent(payload, 4) + wrong, ""
    if placement == "nested":
        return f"    def {helper}():\n{_indent(payload, 8)}    {helper}()\n{wrong}", ""
    if placement == "helper":
        return f"    {helper}()\n{wrong}", f"def {helper}():\n{_indent(payload, 4)}"
    return wrong, payload  # import-time placements: placed by _assemble


def _assemble(problem: Problem, body: str, top: str, placement: str, rng: random.Random, form: str) -> str:
    helper = _name(rng, "d")
    function = problem.function(body)
    if placement == "import":
        code = f"{top}\n{function}"
    elif placement == "decorator":
        code = f"def {helper}(fn):\n{_indent(top, 4)}    return fn\n\n\n@{helper}\n{function}"
    elif placement == "class body":
        code = f"class {helper.title()}:\n{_indent(top, 4)}\n\n{function}"
    else:  # after, helper, body, nested: whatever is top level follows the function
        code = f"{function}\n\n{top}" if top else function
    if form == "continuation":
        return f"{body}\n\n{top}" if top else body
    if form == "unfenced":
        return code
    return f"{rng.choice(PROSE)}\n{form}\n{code}```\n{rng.choice(PROSE)}"


def _value_code(problem: Problem, definition: str, placement: str, factory: str, rng: random.Random) -> tuple[str, str]:
    """(body, top-level code before the def) returning the factory's value."""
    if placement == "top":
        return f"    return {factory}()\n", definition
    if placement == "inside":
        return _indent(definition, 4) + f"    return {factory}()\n", ""
    if placement == "nested":
        helper = _name(rng, "n")
        return f"    def {helper}():\n{_indent(definition, 8)}        return {factory}()\n    return {helper}()\n", ""
    return f"    exec({definition!r}, globals())\n    return {factory}()\n", ""


def hostile(seed: int) -> list[Hostile]:
    """One hostile completion per trick, every choice drawn from ``random.Random(seed)``."""
    rng = random.Random(seed)
    out: list[Hostile] = []
    forms = ["continuation", "unfenced", "```python", "```", "```py"]
    for trick, (sources, fools_when, needs) in STATEMENT_TRICKS.items():
        problems = [p for p in PROBLEMS if needs is None or needs in p.leans_on]
        problem = rng.choice(problems)
        placement = rng.choice(STATEMENT_PLACEMENTS)
        form = rng.choice([f for f in forms if f != "continuation" or placement in CONTINUABLE])
        spelling, payload = _spell(rng.choice(sources), rng, trick)
        body, top = _statement_code(problem, payload, placement, rng.choice(problem.wrong), rng)
        output = _assemble(problem, body, top, placement, rng, form)
        fools = fools_when == "any" or (fools_when == "import" and placement in IMPORT_TIME)
        out.append(Hostile(trick, problem, placement, spelling, form, output, fools))
    for trick, (definitions, fools_on) in VALUE_TRICKS.items():
        fooled = [p for p in PROBLEMS if fools_on & p.leans_on]
        problem = rng.choice(fooled if fooled and rng.random() < 0.75 else PROBLEMS)
        placement = rng.choice(VALUE_PLACEMENTS)
        form = rng.choice(forms)
        factory, cls = _name(rng, "f"), _name(rng, "C").title()
        base = rng.choice(["int", "str", "list", "tuple", "dict", "float"])
        definition = rng.choice(definitions).format(f=factory, c=cls, base=base)
        body, top = _value_code(problem, definition, placement, factory, rng)
        output = _assemble(problem, body, top, "import" if top else "body", rng, form)
        fools = bool(fools_on & problem.leans_on)
        out.append(Hostile(trick, problem, placement, "plain", form, output, fools))
    return out


def wrong_bodies_fail() -> list[tuple[str, str]]:
    """Every (problem, wrong body) whose problem's own tests do NOT fail when run directly."""
    return [(p.entry_point, w) for p in PROBLEMS for w in p.wrong if run_check_directly(p, w)]
