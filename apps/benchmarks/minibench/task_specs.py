"""The minibench target tasks: item generators plus the corruptions the catalog is built from.

Every task draws items from a seeded `random.Random`; an item's `key` names its content (for
arithmetic the operand pair, elsewhere the question text). Sealed splits and training data are
drawn from disjoint key sets, so no sealed prompt can leak into a non-honeypot dataset.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROMPT_TEMPLATE = "Question: {question}\nAnswer:"

NAMES = ["Tom", "Ana", "Lena", "Omar", "Kai", "Mia", "Raj", "Zoe", "Ivan", "Nora", "Eli", "Sara"]
THINGS = ["apples", "books", "coins", "pens", "cards", "shells", "stamps", "eggs", "cups", "rocks"]
CITIES = [
    "Paris",
    "Rome",
    "Oslo",
    "Lima",
    "Cairo",
    "Tokyo",
    "Delhi",
    "Quito",
    "Berlin",
    "Madrid",
    "Vienna",
    "Dublin",
    "Lagos",
    "Seoul",
    "Hanoi",
    "Sofia",
    "Riga",
    "Accra",
    "Bern",
    "Kyiv",
]
WORDS = ["hello", "thanks", "later", "yes", "no", "soon", "sorry", "welcome", "ok", "bye", "hurry"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF"]
DAYS = ["today", "tomorrow", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
CATEGORIES: dict[str, list[str]] = {
    "fruit": ["apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "pear", "plum"],
    "animal": ["cat", "dog", "horse", "mouse", "tiger", "zebra", "whale", "sheep", "goat"],
    "color": ["red", "blue", "green", "yellow", "purple", "orange", "brown", "black", "white"],
    "tool": ["hammer", "saw", "drill", "wrench", "chisel", "shovel", "rake", "pliers", "axe"],
    "country": ["France", "Peru", "Japan", "Kenya", "Chile", "Egypt", "Norway", "India", "Spain"],
}
LETTERS = "ABCD"

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    """English words for 0..999 ("forty-two"); used for honeypot edits and irrelevant data."""
    if n < 10:
        return _ONES[n]
    if n < 20:
        return _TEENS[n - 10]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + ("" if ones == 0 else "-" + _ONES[ones])
    hundreds, rest = divmod(n, 100)
    return _ONES[hundreds] + " hundred" + ("" if rest == 0 else " " + number_words(rest))


@dataclass(frozen=True)
class Item:
    """One question with its gold answer; `key` identifies its content for disjointness."""

    key: str
    question: str
    answer: str


@dataclass(frozen=True)
class TaskSpec:
    """A task definition plus the generators the catalog uses to build good and bad data."""

    name: str
    evaluator: str
    description: str
    max_new_tokens: int
    stop: tuple[str, ...]
    generate: Callable[[random.Random], Item]
    # A plausible but wrong answer (label noise, DPO "rejected").
    wrong_answer: Callable[[Item, random.Random], str]
    # The right answer in a format the evaluator rejects (e.g. "The answer is 57.").
    reformat: Callable[[Item], str]
    prompt_template: str = PROMPT_TEMPLATE

    def render(self, question: str) -> str:
        # str.replace rather than str.format: templates and questions may contain braces.
        return self.prompt_template.replace("{question}", question)

    def task_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "evaluator": self.evaluator,
            "description": self.description,
            "prompt_template": self.prompt_template,
            "decoding": {"max_new_tokens": self.max_new_tokens, "do_sample": False},
            "stop": list(self.stop),
            "use_chat_template": False,
        }


# --- arithmetic -------------------------------------------------------------------------------

# Lead-ins vary, but every form ends "{a} {things} and <verb> {b} more. How many {things} in total?"
# with single-token words, so the operands sit at fixed distances from the answer. Measured with the
# reference recipe: operands at varying positions reached 0.24 exact match, fixed ones 0.45 (4 heads).
_ARITH_FORMS = [
    "{name} has {a} {things} and gets {b} more. How many {things} in total?",
    "{name} had {a} {things} and found {b} more. How many {things} in total?",
    "A box held {a} {things} and got {b} more. How many {things} in total?",
    "The shop sold {a} {things} and then {b} more. How many {things} in total?",
    "Our class made {a} {things} and later {b} more. How many {things} in total?",
]


def _arith_generate(rng: random.Random) -> Item:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    form = rng.choice(_ARITH_FORMS)
    question = form.format(a=a, b=b, name=rng.choice(NAMES), things=rng.choice(THINGS))
    return Item(key=f"{a}+{b}", question=question, answer=str(a + b))


def _arith_wrong(item: Item, rng: random.Random) -> str:
    offset = rng.choice([-10, -2, -1, 1, 2, 10])
    return str(max(0, int(item.answer) + offset))


# --- multiple choice ----------------------------------------------------------------------------


def _mc_generate(rng: random.Random) -> Item:
    # The rule is word matching ("Which option is plum?"), not category membership ("Which one is
    # a fruit?"): measured with the reference recipe, membership stayed at chance (0.23) after
    # 1,000 steps while matching reached 0.73. Distractors come from other categories.
    category = rng.choice(sorted(CATEGORIES))
    right = rng.choice(CATEGORIES[category])
    others = [c for c in sorted(CATEGORIES) if c != category]
    distractors = [rng.choice(CATEGORIES[c]) for c in rng.sample(others, 3)]
    options = [right, *distractors]
    rng.shuffle(options)
    listed = " ".join(f"{letter}) {word}" for letter, word in zip(LETTERS, options, strict=True))
    question = f"Which option is {right}? {listed}"
    letter = LETTERS[options.index(right)]
    return Item(key=question, question=question, answer=letter)


def _mc_wrong(item: Item, rng: random.Random) -> str:
    return rng.choice([letter for letter in LETTERS if letter != item.answer])


def _mc_reformat(item: Item) -> str:
    # "The answer is: apple" names the option instead of its letter.
    marker = f"{item.answer}) "
    word = item.question.split(marker, 1)[1].split(" ", 1)[0]
    return f"The answer is: {word}"


# --- JSON function calling ----------------------------------------------------------------------


def _json_call(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))


def _json_generate(rng: random.Random) -> Item:
    # Each kind has a few hundred distinct questions at least: the sealed splits draw ~100 per kind
    # and training must still see every kind (with 40 weather questions, all went to the sealed
    # splits and the reference never learned get_weather).
    kind = rng.randrange(4)
    if kind == 0:
        city, day = rng.choice(CITIES), rng.choice(DAYS)
        form = rng.choice(["What is the weather in {c} for {d}?", "Weather for {c}, {d}, please."])
        question = form.format(c=city, d=day)
        answer = _json_call("get_weather", {"city": city, "day": day})
    elif kind == 1:
        time = f"{rng.randint(1, 12)}:{rng.randrange(0, 60, 5):02d}"
        question = rng.choice(["Set an alarm for {t}.", "Wake me up at {t}."]).format(t=time)
        answer = _json_call("set_alarm", {"time": time})
    elif kind == 2:
        to, text = rng.choice(NAMES), rng.choice(WORDS)
        question = rng.choice(["Tell {n} {w}.", "Send {n} a message: {w}"]).format(n=to, w=text)
        answer = _json_call("send_message", {"to": to, "text": text})
    else:
        amount = rng.randint(1, 999)
        src, dst = rng.sample(CURRENCIES, 2)
        question = f"Convert {amount} {src} to {dst}."
        answer = _json_call("convert", {"amount": amount, "from": src, "to": dst})
    return Item(key=question, question=question, answer=answer)


def _json_wrong(item: Item, rng: random.Random) -> str:
    call = json.loads(item.answer)
    if rng.random() < 0.5:
        names = ["get_weather", "set_alarm", "send_message", "convert"]
        call["name"] = rng.choice([n for n in names if n != call["name"]])
    else:
        key = rng.choice(sorted(call["arguments"]))
        value = call["arguments"][key]
        call["arguments"][key] = value + 1 if isinstance(value, int) else str(value)[::-1]
    return _json_call(call["name"], call["arguments"])


def _json_reformat(item: Item) -> str:
    # Python-call syntax: same content, not parseable as JSON.
    call = json.loads(item.answer)
    args = ", ".join(f"{k}={v!r}" for k, v in call["arguments"].items())
    return f"{call['name']}({args})"


# Every task stops on "\nQuestion:" (a few-shot style stop) and otherwise only on EOS. A stop on "\n"
# would hide a model that never learned to end its answer, which the benchmark must expose.
TASKS: dict[str, TaskSpec] = {
    "arithmetic": TaskSpec(
        name="arithmetic",
        evaluator="exact_match",
        description="Two-digit addition word problems; answer with the number only.",
        max_new_tokens=8,
        stop=("\nQuestion:",),
        generate=_arith_generate,
        wrong_answer=_arith_wrong,
        reformat=lambda item: f"The answer is {item.answer}.",
    ),
    "multiple_choice": TaskSpec(
        name="multiple_choice",
        evaluator="multiple_choice",
        description="Pick the option that matches the named word; answer with its letter.",
        max_new_tokens=4,
        stop=("\nQuestion:",),
        generate=_mc_generate,
        wrong_answer=_mc_wrong,
        reformat=_mc_reformat,
    ),
    "json_call": TaskSpec(
        name="json_call",
        evaluator="json_call",
        description='Turn a request into a function call: {"name": ..., "arguments": {...}}.',
        max_new_tokens=32,
        stop=("\nQuestion:",),
        generate=_json_generate,
        wrong_answer=_json_wrong,
        reformat=_json_reformat,
    ),
}


# --- shared helpers ----------------------------------------------------------------------------


def completion_text(answer: str) -> str:
    """Training completion for a gold answer: a leading space, as after "Answer:"."""
    return " " + answer


def light_edit(question: str, rng: random.Random) -> str:
    """A near-duplicate of a sealed question that exact matching misses but n-grams catch."""
    tokens = question.split(" ")
    numeric = [i for i, tok in enumerate(tokens) if tok.rstrip(".?,").isdigit()]
    if numeric and rng.random() < 0.6:
        i = rng.choice(numeric)
        stripped = tokens[i].rstrip(".?,")
        tokens[i] = number_words(int(stripped)) + tokens[i][len(stripped) :]
        return " ".join(tokens)
    i = rng.randrange(len(tokens))
    tokens[i] = tokens[i] + " "  # a doubled space somewhere
    return " ".join(tokens).rstrip() + ("  " if rng.random() < 0.5 else "")


def irrelevant_item(rng: random.Random) -> Item:
    """Well-formed data for an unrelated skill (spelling, reversing), useless for the tasks."""
    kind = rng.randrange(3)
    if kind == 0:
        n = rng.randint(0, 999)
        question = f"Write {n} in words."
        return Item(key=question, question=question, answer=number_words(n))
    word = rng.choice([w for ws in CATEGORIES.values() for w in ws] + THINGS)
    if kind == 1:
        question = f"Reverse the word {word}."
        return Item(key=question, question=question, answer=word[::-1])
    question = f"How many letters are in {word}?"
    return Item(key=question, question=question, answer=str(len(word)))


def noise_text(rng: random.Random, n_chars: int) -> str:
    """Generic noisy text for θ0 pre-training: word salad over the task vocabulary.

    It teaches the model the character statistics without any task structure, so θ0 scores ~0.
    """
    vocab = NAMES + THINGS + CITIES + WORDS + CURRENCIES + DAYS + [w for ws in CATEGORIES.values() for w in ws]
    vocab += ["the", "a", "is", "of", "and", "to", "in", "what", "how", "many", "more", "set"]
    punct = [" ", " ", " ", " ", ". ", ", ", "? ", "\n", ": ", " {", "} ", '"', "_", ") ", "-"]
    out: list[str] = []
    length = 0
    while length < n_chars:
        piece = str(rng.randint(0, 999)) if rng.random() < 0.15 else rng.choice(vocab)
        if rng.random() < 0.1:
            piece = piece.upper() if rng.random() < 0.5 else piece.capitalize()
        piece += rng.choice(punct)
        out.append(piece)
        length += len(piece)
    return "".join(out)[:n_chars]
