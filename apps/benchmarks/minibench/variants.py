"""Generated task variants: small evaluation tasks for the task-environment filters (RSI-Craft).

    build_task_variants(seed=0, tasks=("arithmetic",)) -> list[TaskVariant]
    write_task_variants(out_dir, variants)              # variants/<name>/{variant.json,items.jsonl}

Each variant is one pool of items over the evaluator contract (no feedback/final split: the
environment builder splits and downsamples), with metadata saying how it differs from its base
task (templates, vocabulary, difficulty) and what a filter should make of it (`expect`):

    keep                   an ordinary task: θ0 scores ~0, the reference well above
    downsample             more than 300 items (the size filter keeps a seeded 300)
    too_small              fewer than 50 items (the size filter drops it)
    unstable               decoded by sampling at temperature 1.5 (scores vary across repeats)
    metric_ignores_output  gold answers no output can match, so blanking or shuffling the
                           outputs never moves the score (the mutation check rejects it)
    too_hard               θ0 and the reference both below 20 %: three-digit operands, or nouns
                           and names the catalog never uses (multi-token nouns move the operands)
    split                  several subsets with different metrics in one pool (the subset split
                           makes each its own task)

A variant's `subsets` maps each subset to its own task contract (evaluator, prompt_template,
decoding, stop), the same fields as a task.json; every item names its subset. Items never share a
sealed item's key content (operands, entity and option set, call), so a variant cannot leak the
sealed splits; they may share content with catalog data, as any fresh draw from the task would.

The expectations for arithmetic were measured on the ci build's θ0 and reference (docs/benchmarks.md,
"Task variants"); the other tasks' variants are the ordinary "keep" kind plus one "split".
Variants are not written by a build: they are a pure function of the seed (the sealed keys they
avoid are regenerated), so `build_task_variants(seed=manifest["seed"], tasks=manifest["tasks"])`
gives a build's variants.

There is no "too easy" variant: the offline base is θ0, which scores 0 on every task by design
(it is pre-trained on word salad only), so no task can have base and reference both above 80 %.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .task_specs import ARITH_FORMS, CATALOG, LETTERS, NAMES, SEALED, TASKS, THINGS, Item, TaskSpec

VARIANTS_VERSION = 1
EXPECTATIONS = ("keep", "downsample", "too_small", "unstable", "metric_ignores_output", "too_hard", "split")
STANDARD_SIZE = 120
LARGE_SIZE = 400
TINY_SIZE = 30
# Nouns and names the standard arithmetic vocabulary does not use (an "extended vocabulary" variant).
EXTRA_THINGS = ["marbles", "shoes", "keys", "bags", "bottles", "tickets", "plates", "boxes", "candles", "ropes"]
EXTRA_NAMES = ["Hugo", "Iris", "Jonas", "Kira", "Luca", "Mona", "Nils", "Olga", "Pia", "Rosa"]
SAMPLING = {"do_sample": True, "temperature": 1.5, "top_p": 1.0}

Row = dict[str, Any]


@dataclass(frozen=True)
class TaskVariant:
    """One generated task: metadata, a contract per subset, and its items (id, prompt, answer, subset)."""

    name: str
    base_task: str
    templates: str  # "catalog" | "sealed" | "mixed"
    vocabulary: str  # "standard" | "extended"
    difficulty: str  # "standard" | "hard"
    expect: str
    why: str
    subsets: dict[str, dict[str, Any]]
    items: list[Row] = field(default_factory=list)

    def meta(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": VARIANTS_VERSION,
            "base_task": self.base_task,
            "templates": self.templates,
            "vocabulary": self.vocabulary,
            "difficulty": self.difficulty,
            "expect": self.expect,
            "why": self.why,
            "subsets": self.subsets,
            "items": len(self.items),
            "subset_sizes": {s: sum(1 for it in self.items if it["subset"] == s) for s in self.subsets},
        }


def _contract(task: TaskSpec, **overrides: Any) -> dict[str, Any]:
    contract = {k: v for k, v in task.task_json().items() if k not in ("name", "description")}
    contract.update(overrides)
    return contract


def _draw(rng: random.Random, n: int, exclude: set[str], make: Any, *, unique: bool = True) -> list[Item]:
    """`n` items from `make(rng)` whose keys avoid `exclude` (and each other when `unique`)."""
    items: list[Item] = []
    seen = set(exclude)
    for _ in range(200 * n + 1000):
        if len(items) == n:
            return items
        item = make(rng)
        if item.key in seen:
            continue
        if unique:
            seen.add(item.key)
        items.append(item)
    raise RuntimeError(f"could not draw {n} items outside the excluded keys")


def _rows(prefix: str, items: list[Item], subset: str) -> list[Row]:
    return [
        {"id": f"{prefix}-{i:04d}", "prompt": it.question, "answer": it.answer, "subset": subset}
        for i, it in enumerate(items, start=1)
    ]


def _arith_custom(rng: random.Random, *, side: str, lo: int, hi: int, names: list[str], things: list[str]) -> Item:
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    index = rng.randrange(len(ARITH_FORMS[side]))
    form = ARITH_FORMS[side][index]
    question = form.format(a=a, b=b, name=rng.choice(names), things=rng.choice(things))
    return Item(key=f"{a}+{b}", question=question, answer=str(a + b), form=f"{side}/{index}")


def _arith_choice(rng: random.Random, sealed_keys: set[str]) -> Item:
    """The sum as a multiple-choice question (another metric over the same skill)."""
    while True:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if f"{a}+{b}" not in sealed_keys:
            break
    right = a + b
    options = [right, right + 1, right - 1, right + 10]
    rng.shuffle(options)
    listed = " ".join(f"{letter}) {n}" for letter, n in zip(LETTERS, options, strict=True))
    question = f"What is {a} plus {b}? {listed}"
    return Item(key=f"{a}+{b}", question=question, answer=LETTERS[options.index(right)], form="choice/0")


def _arithmetic_variants(rng: random.Random, sealed_keys: set[str]) -> list[TaskVariant]:
    task = TASKS["arithmetic"]
    contract = _contract(task)

    def standard(side: str) -> Any:
        return lambda r: task.generate(r, side)

    out = [
        TaskVariant(
            "arithmetic-sealed-forms", "arithmetic", SEALED, "standard", "standard", "keep",
            "The sealed splits' sentence forms on fresh operands.", {"sum": contract},
            _rows("arith-v-sealed", _draw(rng, STANDARD_SIZE, sealed_keys, standard(SEALED)), "sum"),
        ),
        TaskVariant(
            "arithmetic-catalog-forms", "arithmetic", CATALOG, "standard", "standard", "keep",
            "The catalog's sentence forms on fresh operands.", {"sum": contract},
            _rows("arith-v-catalog", _draw(rng, STANDARD_SIZE, sealed_keys, standard(CATALOG)), "sum"),
        ),
        TaskVariant(
            "arithmetic-extended-vocab", "arithmetic", SEALED, "extended", "standard", "too_hard",
            "Names and nouns the catalog never uses; the reference does not generalise to them.", {"sum": contract},
            _rows(
                "arith-v-vocab",
                _draw(
                    rng, STANDARD_SIZE, sealed_keys,
                    lambda r: _arith_custom(r, side=SEALED, lo=10, hi=99, names=EXTRA_NAMES, things=EXTRA_THINGS),
                ),
                "sum",
            ),
        ),
        TaskVariant(
            "arithmetic-large", "arithmetic", SEALED, "standard", "standard", "downsample",
            f"{LARGE_SIZE} items, over the 300 the size filter keeps.", {"sum": contract},
            _rows("arith-v-large", _draw(rng, LARGE_SIZE, sealed_keys, standard(SEALED)), "sum"),
        ),
        TaskVariant(
            "arithmetic-tiny", "arithmetic", SEALED, "standard", "standard", "too_small",
            f"{TINY_SIZE} items, under the 50 the size filter requires.", {"sum": contract},
            _rows("arith-v-tiny", _draw(rng, TINY_SIZE, sealed_keys, standard(SEALED)), "sum"),
        ),
        TaskVariant(
            "arithmetic-sampled", "arithmetic", SEALED, "standard", "standard", "unstable",
            "Decoded by sampling at temperature 1.5: repeated evaluations disagree.",
            {"sum": _contract(task, decoding={"max_new_tokens": task.max_new_tokens, **SAMPLING})},
            _rows("arith-v-sampled", _draw(rng, STANDARD_SIZE, sealed_keys, standard(SEALED)), "sum"),
        ),
        TaskVariant(
            "arithmetic-blind-metric", "arithmetic", SEALED, "standard", "standard", "metric_ignores_output",
            "Scored with json_call against numeric gold answers: no output can be right, so the score "
            "stays 0 whether outputs are kept, blanked or shuffled.",
            {"sum": _contract(task, evaluator="json_call")},
            _rows("arith-v-blind", _draw(rng, STANDARD_SIZE, sealed_keys, standard(SEALED)), "sum"),
        ),
        TaskVariant(
            "arithmetic-three-digit", "arithmetic", SEALED, "standard", "hard", "too_hard",
            "Three-digit operands; the reference learned two-digit sums only.", {"sum": contract},
            _rows(
                "arith-v-hard",
                _draw(
                    rng, STANDARD_SIZE, sealed_keys,
                    lambda r: _arith_custom(r, side=SEALED, lo=100, hi=999, names=NAMES, things=THINGS),
                ),
                "sum",
            ),
        ),
    ]  # fmt: skip
    mc_contract = _contract(task, evaluator="multiple_choice", decoding={"max_new_tokens": 4, "do_sample": False})
    mixed = _rows("arith-v-mixed-sum", _draw(rng, STANDARD_SIZE, sealed_keys, standard(SEALED)), "sum")
    mixed += _rows(
        "arith-v-mixed-choice",
        _draw(rng, STANDARD_SIZE, sealed_keys, lambda r: _arith_choice(r, sealed_keys)),
        "choice",
    )
    rng.shuffle(mixed)
    out.append(
        TaskVariant(
            "arithmetic-mixed", "arithmetic", "mixed", "standard", "standard", "split",
            "Sums as free answers (exact_match) and as lettered options (multiple_choice) in one pool.",
            {"sum": contract, "choice": mc_contract},
            mixed,
        )
    )  # fmt: skip
    return out


def _simple_variants(task: TaskSpec, rng: random.Random, sealed_keys: set[str], prefix: str) -> list[TaskVariant]:
    contract = _contract(task)
    return [
        TaskVariant(
            f"{task.name}-{side}-forms", task.name, side, "standard", "standard", "keep",
            f"The {side} sentence forms on fresh content.", {"main": contract},
            _rows(f"{prefix}-v-{side}", _draw(rng, STANDARD_SIZE, sealed_keys, lambda r, s=side: task.generate(r, s)),
                  "main"),
        )
        for side in (SEALED, CATALOG)
    ]  # fmt: skip


def _json_name_item(rng: random.Random, sealed_keys: set[str]) -> Item:
    """Which function a request needs, answered with its bare name (exact_match)."""
    task = TASKS["json_call"]
    while True:
        item = task.generate(rng, SEALED)
        if item.key not in sealed_keys:
            break
    name = json.loads(item.answer)["name"]
    question = f"Which function handles this request? {item.question}"
    return Item(key="name:" + item.key, question=question, answer=name, form="name/" + item.form)


def build_task_variants(
    *,
    seed: int = 0,
    tasks: tuple[str, ...] | list[str] = ("arithmetic",),
    sealed_keys: dict[str, set[str]] | None = None,
) -> list[TaskVariant]:
    """The generated variants of `tasks`, deterministic in `seed`.

    `sealed_keys` maps a task to the keys of its sealed items (the build passes them, so no
    variant item shares a sealed item's key content); without it they are regenerated the way
    the build draws them for `seed` under the `full` profile and the `ci` profile both.
    """
    if sealed_keys is None:
        from .catalog import sealed_item_keys  # noqa: PLC0415 - avoid a cycle at import time

        sealed_keys = {t: sealed_item_keys(TASKS[t], seed=seed) for t in tasks}
    variants: list[TaskVariant] = []
    for name in tasks:
        rng = random.Random(f"minibench:{seed}:variants:{name}")  # noqa: S311 - seeded data, not crypto
        keys = sealed_keys.get(name, set())
        if name == "arithmetic":
            variants += _arithmetic_variants(rng, keys)
        elif name == "multiple_choice":
            variants += _simple_variants(TASKS[name], rng, keys, "mc")
        elif name == "json_call":
            task = TASKS[name]
            variants += _simple_variants(task, rng, keys, "json")
            calls = _rows(
                "json-v-mixed-call", _draw(rng, STANDARD_SIZE, keys, lambda r, t=task: t.generate(r, SEALED)), "call"
            )
            names = _rows(
                "json-v-mixed-name",
                _draw(rng, STANDARD_SIZE, set(), lambda r, k=keys: _json_name_item(r, k), unique=False),
                "name",
            )
            mixed = calls + names
            rng.shuffle(mixed)
            name_contract = _contract(task, evaluator="exact_match", decoding={"max_new_tokens": 8, "do_sample": False})
            variants.append(
                TaskVariant(
                    "json_call-mixed", name, "mixed", "standard", "standard", "split",
                    "Requests answered with a call (json_call) and with the function's bare name (exact_match).",
                    {"call": _contract(task), "name": name_contract},
                    mixed,
                )
            )  # fmt: skip
        else:
            raise ValueError(f"unknown task {name!r}")
    return variants


def write_task_variants(out_dir: Path, variants: list[TaskVariant]) -> list[str]:
    """Write each variant to `out_dir/<name>/` (variant.json, items.jsonl); return the names."""
    names = []
    for variant in variants:
        folder = Path(out_dir) / variant.name
        folder.mkdir(parents=True)
        (folder / "variant.json").write_text(json.dumps(variant.meta(), indent=2) + "\n", encoding="utf-8")
        with (folder / "items.jsonl").open("w", encoding="utf-8") as fh:
            for row in variant.items:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        names.append(variant.name)
    return names
