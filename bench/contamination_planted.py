"""The planted set for the contamination benchmark: sealed items, honest rows, disguised copies, hard negatives.

Written as an attacker would, apart from the scanner: nothing here imports the canonicaliser or
the scanner, and the look-alike letters are the attacker's own hand-picked table (the usual
Cyrillic and Greek substitutions, fullwidth and mathematical letters), not Unicode's data that the
defence folds with. Each item's *content* (what makes it that problem) is read back from its
question and answer with this module's own parsing:

- arithmetic (exact match): the numbers of the question in order, and the answer;
- multiple choice: the answer option's word and the option set;
- JSON call: the function name and its arguments.

Honest rows and hard negatives never share a sealed item's content; planted copies always do.
Only the minibench's item generators (``TASKS``) are used, to draw sealed and honest items.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from apps.benchmarks.minibench.task_specs import PROMPT_TEMPLATE, TASKS

Content = tuple[Any, ...]
PLANTED_CLASSES = ("verbatim", "retemplated", "homoglyph", "invisible", "number_forms", "partial", "split")
NEGATIVE_CLASSES = ("shared_part", "sealed_template")

# The attacker's vocabulary for re-templated copies: none of it is the minibench's.
NAMES = ["Priya", "Bruno", "Chen", "Fatima", "Lucas", "Amara", "Jonas", "Keiko", "Diego", "Ines"]
THINGS = ["marbles", "stickers", "tickets", "crayons", "buttons", "pebbles", "cookies", "beads"]
ARITH_FORMS = [
    "{name} collected {a} {things}; later {name} was given {b} more {things}. What is the total number of {things}?",
    "Start with {a} {things}. Add another {b}. How many {things} are there altogether?",
    "If a jar holds {a} {things} and someone drops in {b} extra, how many {things} does the jar hold?",
    "{name}'s team scored {a} points in the morning and {b} points in the evening. Total points?",
    "Sum of {a} and {b}, counted as {things}?",
]
ARITH_ANSWERS = ["{x}", "The total is {x}.", "{a} + {b} = {x}", "Answer: {x}", "So there are {x} {things}."]
MC_FORMS = [
    "Pick the word that names {right}. Choices: {listed}",
    "Among {listed} - which one says {right}?",
    "{listed}\nWhich of these is '{right}'?",
    "Find '{right}' in this list: {listed}",
]
MC_ANSWERS = ["{letter}", "{right}", "The answer is {letter}) {right}.", "{letter}, because it is {right}"]
CALL_FORMS: dict[str, list[str]] = {
    "get_weather": [
        "Could you tell me the forecast for {city} on {day}?",
        "{day}: what will the weather be in {city}?",
    ],
    "set_alarm": ["Please ring me at {time}.", "I need an alarm, {time} sharp."],
    "send_message": ["Write to {to} and say {text}", "Message for {to} - {text}"],
    "convert": ["How much is {amount} {from} in {to}?", "Change {amount} {from} into {to}, please."],
}
# Other problems on two numbers, for the hard negatives: same operands, another answer.
OTHER_PROBLEMS: list[tuple[str, Callable[[int, int], int]]] = [
    ("{name} had {a} {things} and gave away {b}. How many are left, or how many short?", lambda a, b: abs(a - b)),
    ("There are {a} boxes with {b} {things} in each. How many {things}?", lambda a, b: a * b),
    ("{name} has {a} {things} and gets {b} more, then loses 5. How many {things} now?", lambda a, b: a + b - 5),
    ("What is {a} plus {b}, doubled?", lambda a, b: 2 * (a + b)),
]
GENERIC_CALL_FORM = "Use the tool: {args}."

# Look-alikes an attacker picks for Latin letters (Cyrillic, Greek, Latin-extended): the usual
# homograph table, written by hand on purpose so the defence's Unicode data is not tested on itself.
HOMOGLYPHS: dict[str, str] = {
    "a": "аα",
    "c": "сϲ",
    "e": "е",
    "i": "іι",
    "j": "ј",
    "o": "оοσ",
    "p": "рρ",
    "s": "ѕ",
    "x": "хχ",
    "y": "уγ",
    "h": "һ",
    "d": "ԁ",
    "q": "ԛ",
    "w": "ԝ",
    "v": "ν",
    "A": "АΑ",
    "B": "ВΒ",
    "C": "С",
    "E": "ЕΕ",
    "H": "НΗ",
    "I": "ІΙ",
    "J": "Ј",
    "K": "КΚ",
    "M": "МΜ",
    "N": "Ν",
    "O": "ОΟ",
    "P": "РΡ",
    "S": "Ѕ",
    "T": "ТΤ",
    "X": "ХΧ",
    "Y": "УΥ",
    "Z": "Ζ",
}
INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u2060", "\u00ad", "\ufeff", "\u200e", "\u200f", "\u202a", "\u2062"]
COMBINING = ["\u0301", "\u0308", "\u0303", "\u034f", "\ufe0f"]
_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
DIGIT_SETS = ["٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "𝟎𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖𝟗", "০১২৩৪৫৬৭৮৯"]


def spell(n: int, rng: random.Random) -> str:
    """English words for 0..999, as a person writes them ("forty-two", "one hundred and five")."""
    if n < 10:
        return _ONES[n]
    if n < 20:
        return _TEENS[n - 10]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + ("" if ones == 0 else rng.choice(["-", " "]) + _ONES[ones])
    hundreds, rest = divmod(n, 100)
    head = _ONES[hundreds] + " hundred"
    return head if rest == 0 else head + rng.choice([" and ", " "]) + spell(rest, rng)


def number_form(n: int, rng: random.Random) -> str:
    """``n`` written another way: words, leading zeros, a zero fraction, or other scripts' digits."""
    kind = rng.randrange(5)
    if kind == 0:
        return spell(n, rng)
    if kind == 1:
        return "0" * rng.randint(1, 2) + str(n)
    if kind == 2:
        return f"{n}.{'0' * rng.randint(1, 2)}"
    digits = rng.choice(DIGIT_SETS)
    return "".join(digits[int(d)] for d in str(n))


# --------------------------------------------------------------------------- items and content


@dataclass(frozen=True)
class Sealed:
    id: str
    task: str
    evaluator: str
    prompt: str
    answer: str

    def as_item(self) -> dict[str, str]:
        return {"id": self.id, "prompt": self.prompt, "answer": self.answer, "evaluator": self.evaluator}


def parse_options(question: str) -> list[tuple[str, str]]:
    return re.findall(r"\b([A-D])\) (\S+)", question)


def content_of(task: str, question: str, answer: str) -> Content:
    """What makes an item that problem, read from its text."""
    if task == "arithmetic":
        return ("arith", tuple(int(x) for x in re.findall(r"\d+", question)), int(answer))
    if task == "multiple_choice":
        options = dict(parse_options(question))
        return ("mc", options[answer.strip()[:1]], frozenset(options.values()))
    call = json.loads(answer)
    return ("call", call["name"], tuple(sorted((k, str(v)) for k, v in call["arguments"].items())))


def draw_sealed(n: int, seed: int) -> list[Sealed]:
    """``n`` sealed items with distinct contents, the tasks in turn (a task whose pool runs dry is skipped)."""
    rng = random.Random(f"planted:{seed}:sealed")  # noqa: S311 - seeded benchmark data
    names = sorted(TASKS)
    out: list[Sealed] = []
    seen: set[Content] = set()
    dry: set[str] = set()
    turn = 0
    while len(out) < n:
        name = names[turn % len(names)]
        turn += 1
        if name in dry:
            continue
        task = TASKS[name]
        for _ in range(200):
            item = task.generate(rng)
            content = content_of(name, item.question, item.answer)
            if content not in seen:
                seen.add(content)
                out.append(Sealed(f"{name}-{len(out):05d}", name, task.evaluator, item.question, item.answer))
                break
        else:
            dry.add(name)
            if len(dry) == len(names):
                raise SystemExit(f"only {len(out)} distinct sealed items could be drawn")
    return out


def sft(question: str, answer: str) -> dict[str, str]:
    return {"prompt": PROMPT_TEMPLATE.replace("{question}", question), "completion": " " + answer}


# --------------------------------------------------------------------------- disguises


def retemplate(item: Sealed, rng: random.Random) -> dict[str, Any]:
    """The same content in another sentence form, other names and nouns, another answer style and row shape."""
    if item.task == "arithmetic":
        a, b = (int(x) for x in re.findall(r"\d+", item.prompt)[:2])
        fill = {"a": a, "b": b, "x": item.answer, "name": rng.choice(NAMES), "things": rng.choice(THINGS)}
        question = rng.choice(ARITH_FORMS).format(**fill)
        answer = rng.choice(ARITH_ANSWERS).format(**fill)
    elif item.task == "multiple_choice":
        options = parse_options(item.prompt)
        right = dict(options)[item.answer.strip()[:1]]
        words = [w for _, w in options]
        rng.shuffle(words)
        style = rng.randrange(3)
        if style == 0:
            listed = " ".join(f"{chr(65 + k)}) {w}" for k, w in enumerate(words))
        elif style == 1:
            listed = ", ".join(words[:-1]) + " or " + words[-1]
        else:
            listed = " / ".join(f"({k + 1}) {w}" for k, w in enumerate(words))
        question = rng.choice(MC_FORMS).format(right=right, listed=listed)
        letter = chr(65 + words.index(right)) if style == 0 else right
        answer = rng.choice(MC_ANSWERS).format(letter=letter, right=right)
    else:
        call = json.loads(item.answer)
        args = call["arguments"]
        forms = CALL_FORMS.get(call["name"])
        if forms:
            question = rng.choice(forms).format(**args)
        else:
            question = GENERIC_CALL_FORM.format(args=", ".join(f"{k} {v}" for k, v in args.items()))
        style = rng.randrange(3)
        if style == 0:
            answer = json.dumps(call)  # spaced separators
        elif style == 1:
            answer = json.dumps({"arguments": dict(reversed(list(args.items()))), "name": call["name"]})
        else:
            answer = f"{call['name']}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
    shape = rng.randrange(3)
    if shape == 0:
        return {"prompt": question, "completion": " " + answer}
    if shape == 1:
        return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}
    return {"text": f"{question}\n{answer}"}


def _each_string(row: Any, change: Callable[[str], str]) -> Any:
    if isinstance(row, str):
        return change(row)
    if isinstance(row, dict):
        return {k: v if k == "role" else _each_string(v, change) for k, v in row.items()}
    if isinstance(row, list):
        return [_each_string(v, change) for v in row]
    return row


def homoglyphs(text: str, rng: random.Random) -> str:
    """Every word gets look-alike letters (one or more); some texts become fullwidth or math letters."""
    style = rng.randrange(6)
    if style == 0:
        return "".join(chr(ord(c) - 0x21 + 0xFF01) if "!" <= c <= "~" else c for c in text)  # fullwidth
    if style == 1:
        return "".join(_math_bold(c) for c in text)
    out = []
    for word in re.split(r"(\s+)", text):
        chars = list(word)
        spots = [k for k, c in enumerate(chars) if c in HOMOGLYPHS]
        for k in rng.sample(spots, min(len(spots), rng.randint(1, 3))):
            chars[k] = rng.choice(HOMOGLYPHS[chars[k]])
        out.append("".join(chars))
    return "".join(out)


def _math_bold(c: str) -> str:
    if "A" <= c <= "Z":
        return chr(0x1D400 + ord(c) - ord("A"))
    if "a" <= c <= "z":
        return chr(0x1D41A + ord(c) - ord("a"))
    if "0" <= c <= "9":
        return chr(0x1D7CE + ord(c) - ord("0"))
    return c


def invisible(text: str, rng: random.Random) -> str:
    """Zero-width and format characters (or stacked combining marks) inside every third word, digits too."""
    words = re.split(r"(\s+)", text)
    marks = COMBINING if rng.random() < 0.25 else INVISIBLE
    for k in range(0, len(words), 2 * rng.choice([1, 3])):
        w = words[k]
        if len(w) >= 2:
            cut = rng.randrange(1, len(w))
            words[k] = w[:cut] + rng.choice(marks) + w[cut:]
    return "".join(words)


def number_forms(text: str, rng: random.Random) -> str:
    return re.sub(r"\d+", lambda m: number_form(int(m.group(0)), rng), text)


def partial(item: Sealed, rng: random.Random) -> dict[str, Any]:
    """Only the item's content, the rest of its text gone (as in a scraped answer key)."""
    if item.task == "arithmetic":
        a, b = re.findall(r"\d+", item.prompt)[:2]
        return {"text": rng.choice([f"{a} + {b} = {item.answer}", f"{a} and {b} make {item.answer}"])}
    if item.task == "multiple_choice":
        options = parse_options(item.prompt)
        right = dict(options)[item.answer.strip()[:1]]
        return {"prompt": f"{right}? " + ", ".join(w for _, w in options), "completion": " " + right}
    call = json.loads(item.answer)
    keywords = " ".join(str(v) for v in call["arguments"].values())
    return {"prompt": keywords, "completion": " " + item.answer}


@dataclass
class Planted:
    """Labelled rows: ``truth`` maps a row index to (class, sample id or None for a negative)."""

    rows: list[Any] = field(default_factory=list)
    truth: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    split_datasets: list[list[tuple[dict[str, Any], str]]] = field(default_factory=list)

    def add(self, row: Any, cls: str, sample_id: str | None) -> None:
        self.truth[len(self.rows)] = (cls, sample_id)
        self.rows.append(row)


def planted_rows(sealed: list[Sealed], per_class: int, seed: int) -> Planted:
    """``per_class`` copies per class (each of a different sealed item, the tasks in turn)."""
    rng = random.Random(f"planted:{seed}:copies")  # noqa: S311 - seeded benchmark data
    out = Planted()
    by_task: dict[str, list[Sealed]] = {}
    for item in sealed:
        by_task.setdefault(item.task, []).append(item)
    tasks = sorted(by_task)

    def pick(k: int) -> Sealed:
        return rng.choice(by_task[tasks[k % len(tasks)]])

    for k in range(per_class):
        item = pick(k)
        out.add(sft(item.prompt, item.answer), "verbatim", item.id)
        item = pick(k)
        out.add(retemplate(item, rng), "retemplated", item.id)
        item = pick(k)
        base = sft(item.prompt, item.answer) if rng.random() < 0.5 else retemplate(item, rng)
        out.add(_each_string(base, lambda s: homoglyphs(s, rng)), "homoglyph", item.id)
        item = pick(k)
        base = sft(item.prompt, item.answer) if rng.random() < 0.5 else retemplate(item, rng)
        out.add(_each_string(base, lambda s: invisible(s, rng)), "invisible", item.id)
        item = pick(k)
        base = sft(item.prompt, item.answer) if rng.random() < 0.5 else retemplate(item, rng)
        if item.task == "json_call":
            # The answer's JSON stays parseable for the evaluator: change numbers in the question only.
            base = {**base, "prompt": number_forms(base["prompt"], rng)} if "prompt" in base else base
            if "prompt" not in base:
                base = sft(number_forms(item.prompt, rng), item.answer)
        else:
            base = _each_string(base, lambda s: number_forms(s, rng))
        out.add(base, "number_forms", item.id)
        item = pick(k)
        out.add(partial(item, rng), "partial", item.id)
    # Split across datasets: 16 datasets of 3 verbatim copies each, every one under a per-dataset
    # tolerance of 3; each must still be found in its own dataset.
    chosen = rng.sample(sealed, 48)
    for d in range(16):
        out.split_datasets.append([(sft(it.prompt, it.answer), it.id) for it in chosen[3 * d : 3 * d + 3]])
    return out


# --------------------------------------------------------------------------- honest rows


def honest_rows(n: int, seed: int, sealed_content: set[Content]) -> list[dict[str, str]]:
    """Honest training rows: new items (content disjoint from the sealed), in the benchmark's template."""
    rng = random.Random(f"planted:{seed}:honest")  # noqa: S311 - seeded benchmark data
    names = sorted(TASKS)
    rows: list[dict[str, str]] = []
    while len(rows) < n:
        name = rng.choice(names)
        item = TASKS[name].generate(rng)
        if content_of(name, item.question, item.answer) not in sealed_content:
            rows.append(sft(item.question, item.answer))
    return rows


def hard_negatives(sealed: list[Sealed], per_class: int, seed: int, sealed_content: set[Content]) -> Planted:
    """Honest rows that look like copies and are not.

    ``shared_part``: part of a sealed item's content kept, the rest changed (same operands and another
    answer, the operands swapped, one operand changed; same word asked among other options, the same
    options asking for another word; the same call with one argument changed or two swapped).
    ``sealed_template``: a sealed item's exact sentence with new content put in.
    """
    rng = random.Random(f"planted:{seed}:negatives")  # noqa: S311 - seeded benchmark data
    out = Planted()
    by_task: dict[str, list[Sealed]] = {}
    for item in sealed:
        by_task.setdefault(item.task, []).append(item)
    tasks = sorted(by_task)
    made = {cls: 0 for cls in NEGATIVE_CLASSES}
    attempts = 0
    while min(made.values()) < per_class and attempts < per_class * 200:
        attempts += 1
        item = rng.choice(by_task[tasks[attempts % len(tasks)]])
        cls = min(made, key=lambda c: made[c])
        made_row = _negative(item, cls, rng)
        if made_row is None:
            continue
        question, answer = made_row
        if content_of(item.task, question, answer) in sealed_content:
            continue  # by chance another sealed item: not a negative
        row = sft(question, answer) if rng.random() < 0.7 else {"text": f"{question} {answer}"}
        out.add(row, cls, None)
        made[cls] += 1
    return out


def _negative(item: Sealed, cls: str, rng: random.Random) -> tuple[str, str] | None:
    if item.task == "arithmetic":
        a, b = (int(x) for x in re.findall(r"\d+", item.prompt)[:2])
        template = item.prompt.replace(str(a), "{a}", 1).replace(str(b), "{b}", 1)
        if cls == "shared_part":
            kind = rng.randrange(3)
            if kind == 0:
                # Another problem on the same two numbers (the sealed sentence itself would be a copy).
                name, things = rng.choice(NAMES), rng.choice(THINGS)
                form, value = rng.choice(OTHER_PROBLEMS)
                return form.format(a=a, b=b, name=name, things=things), str(value(a, b))
            if kind == 1:
                return template.format(a=b, b=a), str(a + b)  # operands swapped
            c = rng.randint(10, 99)
            return template.format(a=a, b=c), str(a + c)  # one operand kept
        c, d = rng.randint(10, 99), rng.randint(10, 99)
        return template.format(a=c, b=d), str(c + d)
    if item.task == "multiple_choice":
        options = parse_options(item.prompt)
        letter = item.answer.strip()[:1]
        right = dict(options)[letter]
        words = [w for _, w in options]
        pool = sorted({w for it in TASKS_WORDS for w in it} - set(words))
        if cls == "shared_part" and rng.random() < 0.5:
            # The same options asking for another of them.
            other = rng.choice([w for w in words if w != right])
            question = item.prompt.replace(f"is {right}?", f"is {other}?") if f"is {right}?" in item.prompt else None
            if question is None:
                return None
            return question, chr(65 + words.index(other))
        if cls == "shared_part":
            # The same word among other options.
            new_words = [w if w == right else rng.choice(pool) for w in words]
        else:
            # The sealed sentence, every word new.
            new_words = rng.sample(pool, len(words))
            right = new_words[words.index(right)]
        question = item.prompt
        for (lab, old), new in zip(options, new_words, strict=True):
            question = question.replace(f"{lab}) {old}", f"{lab}) {new}")
        question = re.sub(r"is \S+\?", f"is {right}?", question, count=1)
        return question, letter
    call = json.loads(item.answer)
    args = dict(call["arguments"])
    if not args:
        return None
    if cls == "shared_part" and call["name"] == "convert" and rng.random() < 0.5:
        question = item.prompt.replace(args["from"], "\0").replace(args["to"], args["from"]).replace("\0", args["to"])
        args["from"], args["to"] = args["to"], args["from"]
        return question, json.dumps({"name": call["name"], "arguments": args}, separators=(",", ":"))
    keys = sorted(args) if cls == "sealed_template" else [rng.choice(sorted(args))]
    question = item.prompt
    for key in keys:
        old = args[key]
        new = _other_value(key, old, rng)
        if str(old) not in question:
            return None
        question = question.replace(str(old), str(new), 1)
        args[key] = new
    return question, json.dumps({"name": call["name"], "arguments": args}, separators=(",", ":"))


_VALUES: dict[str, list[str]] = {
    "city": ["Porto", "Nairobi", "Lisbon", "Prague", "Minsk", "Havana", "Perth"],
    "day": ["today", "tomorrow", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    "to": ["Priya", "Bruno", "Chen", "Fatima", "Lucas"],
    "text": ["cheers", "congrats", "goodnight", "see you"],
}


def _other_value(key: str, old: Any, rng: random.Random) -> Any:
    if isinstance(old, int):
        return rng.choice([v for v in range(1, 1000) if v != old])
    if key == "time":
        return f"{rng.randint(1, 12)}:{rng.randrange(0, 60, 5):02d}"
    pool = [v for v in _VALUES.get(key, ["other", "another"]) if v != old]
    return rng.choice(pool)


# Every option word the minibench's multiple-choice generator can draw (read from its items, so a
# wider vocabulary is picked up without naming the generator's lists).
def _mc_words(samples: int = 4000) -> list[list[str]]:
    rng = random.Random("planted:mc-words")  # noqa: S311
    words: set[str] = set()
    for _ in range(samples):
        item = TASKS["multiple_choice"].generate(rng)
        words.update(w for _, w in parse_options(item.question))
    return [sorted(words)]


TASKS_WORDS = _mc_words()
