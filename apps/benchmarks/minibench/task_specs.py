"""The minibench target tasks: item generators plus the corruptions the catalog is built from.

Every task draws items from a seeded `random.Random`; an item's `key` names its salient content
(arithmetic: the operands in order; multiple choice: the entity and its option set; function
calls: the name and arguments). Sealed splits and training data are drawn from disjoint key sets
and written in disjoint template families (`SEALED` vs `CATALOG` forms), so no non-honeypot
dataset holds a sealed prompt, a sealed item's key content, or a sealed sentence form.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PROMPT_TEMPLATE = "Question: {question}\nAnswer:"
# The two template families. Sealed splits are written only in SEALED forms, catalog data only in
# CATALOG forms, so an honest catalog row never shares a sealed item's sentence form; the task's
# prompt_template and evaluator (the contract) are the same for both.
CATALOG = "catalog"
SEALED = "sealed"
SIDES = (CATALOG, SEALED)

NAMES = [
    "Tom", "Ana", "Lena", "Omar", "Kai", "Mia", "Raj", "Zoe", "Ivan", "Nora", "Eli", "Sara",
    "Ben", "Lily", "Sam", "Maya", "Leo", "Ella", "Max", "Ruby", "Dan", "Amy", "Jack", "Emma",
]  # fmt: skip
THINGS = ["apples", "books", "coins", "pens", "cards", "shells", "stamps", "eggs", "cups", "rocks"]
CITIES = [
    "Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Delhi", "Quito", "Berlin", "Madrid",
    "Vienna", "Dublin", "Lagos", "Seoul", "Hanoi", "Sofia", "Riga", "Accra", "Bern", "Kyiv",
    "London", "Prague", "Athens", "Lisbon", "Warsaw", "Moscow", "Dakar", "Nairobi", "Tunis", "Doha",
    "Dubai", "Manila", "Jakarta", "Bangkok", "Beijing", "Sydney", "Toronto", "Boston", "Chicago", "Denver",
]  # fmt: skip
WORDS = [
    "hello", "thanks", "later", "yes", "no", "soon", "sorry", "welcome", "ok", "bye", "hurry",
    "congrats", "goodnight", "cheers", "wait", "maybe", "agreed", "done", "call me", "on my way",
    "see you", "good luck", "take care", "running late",
]  # fmt: skip
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK"]
DAYS = [
    "today", "tomorrow", "tonight", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
    "Sunday", "the weekend", "next week",
]  # fmt: skip
# Wide enough that the sealed splits (400 items in `full`) use a small share of the entity/answer
# pairs: 12 categories x 20 words = 240 entities, 960 (entity, letter) pairs.
CATEGORIES: dict[str, list[str]] = {
    "fruit": [
        "apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "pear", "plum", "melon", "kiwi",
        "lime", "fig", "date", "olive", "guava", "papaya", "apricot", "berry", "orange"
    ],
    "animal": [
        "cat", "dog", "horse", "mouse", "tiger", "zebra", "whale", "sheep", "goat", "lion", "bear", "wolf",
        "fox", "deer", "camel", "rabbit", "monkey", "panda", "otter", "seal"
    ],
    "color": [
        "red", "blue", "green", "yellow", "purple", "pink", "brown", "black", "white", "gray", "violet",
        "indigo", "amber", "beige", "cyan", "gold", "silver", "maroon", "navy", "teal"
    ],
    "tool": [
        "hammer", "saw", "drill", "wrench", "chisel", "shovel", "rake", "pliers", "axe", "file", "level",
        "clamp", "ladder", "trowel", "mallet", "scraper", "spanner", "hoe", "vise", "awl"
    ],
    "country": [
        "France", "Peru", "Japan", "Kenya", "Chile", "Egypt", "Norway", "India", "Spain", "Italy", "Brazil",
        "Canada", "Mexico", "Ghana", "Nepal", "Cuba", "Greece", "Poland", "Sweden", "Iran"
    ],
    "vegetable": [
        "carrot", "potato", "onion", "garlic", "celery", "pepper", "tomato", "cabbage", "lettuce", "radish",
        "turnip", "spinach", "pea", "bean", "leek", "kale", "beet", "squash", "corn", "yam"
    ],
    "instrument": [
        "piano", "guitar", "violin", "drum", "flute", "harp", "cello", "trumpet", "banjo", "organ", "tuba",
        "oboe", "lute", "bass", "horn", "sitar", "ukulele", "bugle", "gong", "fiddle"
    ],
    "vehicle": [
        "car", "bus", "truck", "train", "bike", "boat", "ship", "plane", "tram", "van", "taxi", "jeep",
        "yacht", "canoe", "kayak", "ferry", "sled", "scooter", "wagon", "rocket"
    ],
    "clothing": [
        "shirt", "dress", "coat", "hat", "scarf", "sock", "shoe", "boot", "glove", "belt", "skirt",
        "jacket", "vest", "cap", "tie", "robe", "sweater", "jeans", "sandal", "cloak"
    ],
    "sport": [
        "soccer", "tennis", "golf", "hockey", "rugby", "boxing", "judo", "karate", "rowing", "skiing",
        "cricket", "polo", "archery", "fencing", "diving", "surfing", "cycling", "running", "chess", "darts"
    ],
    "metal": [
        "iron", "copper", "zinc", "tin", "lead", "nickel", "cobalt", "bronze", "brass", "steel", "chrome",
        "mercury", "titanium", "platinum", "aluminum", "lithium", "sodium", "radium", "uranium", "tungsten"
    ],
    "furniture": [
        "chair", "table", "sofa", "bed", "desk", "shelf", "stool", "bench", "cabinet", "dresser", "couch",
        "crib", "futon", "ottoman", "wardrobe", "armchair", "bookcase", "hammock", "cot", "rack"
    ],
}  # fmt: skip
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
    """One question with its gold answer.

    `key` names the item's salient content, whatever its sentence form: for arithmetic the
    operands in order ("23+45", which fixes the answer), for multiple choice the question entity
    with its option set ("plum|cat/plum/red/saw"), for function calls the call itself (name and
    arguments as canonical JSON). Sealed items have distinct keys, and no catalog row shares one.
    `form` names the template the question was written in ("catalog/2", "sealed/0").
    """

    key: str
    question: str
    answer: str
    form: str = ""


Generator = Callable[[random.Random, str], Item]


@dataclass(frozen=True)
class TaskSpec:
    """A task definition plus the generators the catalog uses to build good and bad data."""

    name: str
    evaluator: str
    description: str
    max_new_tokens: int
    stop: tuple[str, ...]
    # generator(rng, side): an item written in one of `forms[side]` (side is CATALOG or SEALED).
    generator: Generator
    # A plausible but wrong answer (label noise, DPO "rejected").
    wrong_answer: Callable[[Item, random.Random], str]
    # The right answer in a format the evaluator rejects (e.g. "The answer is 57.").
    reformat: Callable[[Item], str]
    # The sentence forms per side; the two sides share none.
    forms: dict[str, tuple[str, ...]] = field(default_factory=dict)
    prompt_template: str = PROMPT_TEMPLATE

    def generate(self, rng: random.Random, side: str | None = None) -> Item:
        """An item in a form of `side`; without a side, of either family (drawn from `rng`)."""
        if side is None:
            side = rng.choice(SIDES)
        return self.generator(rng, side)

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


def _pick(rng: random.Random, forms: dict[str, tuple[str, ...]], side: str) -> tuple[str, str]:
    """A random template of `side` and its form id ("sealed/1")."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    index = rng.randrange(len(forms[side]))
    return forms[side][index], f"{side}/{index}"


# --- arithmetic -------------------------------------------------------------------------------

# Lead-ins and verbs vary, but every form ends "{a} {things} and <verb> {b} more. How many {things}
# in total?" with single-token words, so the operands sit at fixed distances from the answer.
# Measured with the reference recipe: operands at varying positions reached 0.24 exact match, fixed
# ones 0.45 (4 heads). Sealed forms use lead-ins and verbs no catalog form uses.
ARITH_FORMS: dict[str, tuple[str, ...]] = {
    CATALOG: (
        "{name} has {a} {things} and gets {b} more. How many {things} in total?",
        "{name} had {a} {things} and found {b} more. How many {things} in total?",
        "A box held {a} {things} and got {b} more. How many {things} in total?",
        "The shop sold {a} {things} and then {b} more. How many {things} in total?",
        "Our class made {a} {things} and later {b} more. How many {things} in total?",
    ),
    SEALED: (
        "{name} kept {a} {things} and won {b} more. How many {things} in total?",
        "A jar took {a} {things} and added {b} more. How many {things} in total?",
        "My team built {a} {things} and bought {b} more. How many {things} in total?",
        "This farm grew {a} {things} and picked {b} more. How many {things} in total?",
    ),
}


def arith_item(a: int, b: int, form: str, form_id: str, rng: random.Random) -> Item:
    question = form.format(a=a, b=b, name=rng.choice(NAMES), things=rng.choice(THINGS))
    return Item(key=f"{a}+{b}", question=question, answer=str(a + b), form=form_id)


def _arith_generate(rng: random.Random, side: str) -> Item:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    form, form_id = _pick(rng, ARITH_FORMS, side)
    return arith_item(a, b, form, form_id, rng)


def _arith_wrong(item: Item, rng: random.Random) -> str:
    offset = rng.choice([-10, -2, -1, 1, 2, 10])
    return str(max(0, int(item.answer) + offset))


# --- multiple choice ----------------------------------------------------------------------------

# The entity always precedes the option list, as in the forms the recipe was measured on.
MC_FORMS: dict[str, tuple[str, ...]] = {
    CATALOG: (
        "Which option is {w}? {opts}",
        "Pick the option that says {w}: {opts}",
        "Choose {w}. {opts}",
    ),
    SEALED: (
        "Which letter names {w}? {opts}",
        "Find the word {w} below. {opts}",
    ),
}


def mc_item(right: str, options: list[str], form: str, form_id: str) -> Item:
    listed = " ".join(f"{letter}) {word}" for letter, word in zip(LETTERS, options, strict=True))
    question = form.format(w=right, opts=listed)
    key = right + "|" + "/".join(sorted(options))
    return Item(key=key, question=question, answer=LETTERS[options.index(right)], form=form_id)


def _mc_generate(rng: random.Random, side: str) -> Item:
    # The rule is word matching ("Which option is plum?"), not category membership ("Which one is
    # a fruit?"): measured with the reference recipe, membership stayed at chance (0.23) after
    # 1,000 steps while matching reached 0.73. Distractors come from other categories.
    category = rng.choice(sorted(CATEGORIES))
    right = rng.choice(CATEGORIES[category])
    others = [c for c in sorted(CATEGORIES) if c != category]
    distractors = [rng.choice(CATEGORIES[c]) for c in rng.sample(others, 3)]
    options = [right, *distractors]
    rng.shuffle(options)
    form, form_id = _pick(rng, MC_FORMS, side)
    return mc_item(right, options, form, form_id)


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


# Per call kind, the forms of each side.
JSON_FORMS: dict[str, dict[str, tuple[str, ...]]] = {
    "get_weather": {
        CATALOG: ("What is the weather in {c} for {d}?", "Weather for {c}, {d}, please."),
        SEALED: ("Forecast for {c}, {d}?", "Will it rain in {c} {d}?"),
    },
    "set_alarm": {
        CATALOG: ("Set an alarm for {t}.", "Wake me up at {t}."),
        SEALED: ("Alarm at {t}, please.", "Please ring me at {t}."),
    },
    "send_message": {
        CATALOG: ("Tell {n} {w}.", "Send {n} a message: {w}"),
        SEALED: ("Message {n}: {w}", "Let {n} know: {w}"),
    },
    "convert": {
        CATALOG: ("Convert {amount} {src} to {dst}.", "How much is {amount} {src} in {dst}?"),
        SEALED: ("Change {amount} {src} into {dst}.", "Exchange {amount} {src} for {dst}."),
    },
}
JSON_NAMES = tuple(JSON_FORMS)


def json_item(name: str, arguments: dict[str, Any], rng: random.Random, side: str) -> Item:
    form, form_id = _pick(rng, JSON_FORMS[name], side)
    if name == "get_weather":
        question = form.format(c=arguments["city"], d=arguments["day"])
    elif name == "set_alarm":
        question = form.format(t=arguments["time"])
    elif name == "send_message":
        question = form.format(n=arguments["to"], w=arguments["text"])
    else:
        question = form.format(amount=arguments["amount"], src=arguments["from"], dst=arguments["to"])
    answer = _json_call(name, arguments)
    return Item(key=answer, question=question, answer=answer, form=f"{name}/{form_id}")


def _json_generate(rng: random.Random, side: str) -> Item:
    # Each kind has hundreds of distinct calls: the sealed splits draw ~100 per kind and training
    # must still see every kind (with 40 weather questions, all went to the sealed splits and the
    # reference never learned get_weather). Calls: 480 weather, 720 alarms, 576 messages, ~56k conversions.
    name = JSON_NAMES[rng.randrange(4)]
    arguments: dict[str, Any]
    if name == "get_weather":
        arguments = {"city": rng.choice(CITIES), "day": rng.choice(DAYS)}
    elif name == "set_alarm":
        arguments = {"time": f"{rng.randint(1, 12)}:{rng.randrange(0, 60):02d}"}
    elif name == "send_message":
        arguments = {"to": rng.choice(NAMES), "text": rng.choice(WORDS)}
    else:
        src, dst = rng.sample(CURRENCIES, 2)
        arguments = {"amount": rng.randint(1, 999), "from": src, "to": dst}
    return json_item(name, arguments, rng, side)


def _json_wrong(item: Item, rng: random.Random) -> str:
    call = json.loads(item.answer)
    if rng.random() < 0.5:
        call["name"] = rng.choice([n for n in JSON_NAMES if n != call["name"]])
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


def _flat_json_forms() -> dict[str, tuple[str, ...]]:
    return {side: tuple(f for kind in JSON_FORMS.values() for f in kind[side]) for side in SIDES}


# Every task stops on "\nQuestion:" (a few-shot style stop) and otherwise only on EOS. A stop on "\n"
# would hide a model that never learned to end its answer, which the benchmark must expose.
TASKS: dict[str, TaskSpec] = {
    "arithmetic": TaskSpec(
        name="arithmetic",
        evaluator="exact_match",
        description="Two-digit addition word problems; answer with the number only.",
        max_new_tokens=8,
        stop=("\nQuestion:",),
        generator=_arith_generate,
        wrong_answer=_arith_wrong,
        reformat=lambda item: f"The answer is {item.answer}.",
        forms=ARITH_FORMS,
    ),
    "multiple_choice": TaskSpec(
        name="multiple_choice",
        evaluator="multiple_choice",
        description="Pick the option that matches the named word; answer with its letter.",
        max_new_tokens=4,
        stop=("\nQuestion:",),
        generator=_mc_generate,
        wrong_answer=_mc_wrong,
        reformat=_mc_reformat,
        forms=MC_FORMS,
    ),
    "json_call": TaskSpec(
        name="json_call",
        evaluator="json_call",
        description='Turn a request into a function call: {"name": ..., "arguments": {...}}.',
        max_new_tokens=32,
        stop=("\nQuestion:",),
        generator=_json_generate,
        wrong_answer=_json_wrong,
        reformat=_json_reformat,
        forms=_flat_json_forms(),
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
