"""The scanner's layers on the canonical form, and the salient-content layer, against generated attacks.

Sealed items come from the minibench generators; every attack class gets several generated
variants (this file's own re-templates, look-alike letters, invisible characters and number
spellings), and the hard negatives — honest rows sharing part of an item's content, or a sealed
item's sentence with new content — must not match.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from apps.benchmarks.minibench.task_specs import PROMPT_TEMPLATE, TASKS
from apps.integrity.contamination import LAYERS, ContaminationScanner, Match
from tests.apps.integrity.test_contamination_canonical import hidden_variant, homoglyph_variant, number_variant, words


def content(task: str, question: str, answer: str) -> Any:
    """What makes an item that problem (two sealed items never share it)."""
    if task == "arithmetic":
        return tuple(int(x) for x in re.findall(r"\d+", question)[:2])
    if task == "multiple_choice":
        options = dict(re.findall(r"\b([A-D])\) (\S+)", question))
        return options[answer], frozenset(options.values())
    return json.dumps(json.loads(answer), sort_keys=True)


def draw(task: str, n: int, seed: str) -> list[dict[str, str]]:
    rng = random.Random(seed)
    spec = TASKS[task]
    items: dict[Any, dict[str, str]] = {}
    while len(items) < n:
        item = spec.generate(rng)
        key = content(task, item.question, item.answer)
        items.setdefault(key, {"id": f"{task}-{len(items):04d}", "prompt": item.question, "answer": item.answer})
    return list(items.values())


ARITH = draw("arithmetic", 120, "layers:arith")
CHOICE = draw("multiple_choice", 120, "layers:mc")
CALLS = draw("json_call", 120, "layers:json")
EVALUATOR = {"arithmetic": "exact_match", "multiple_choice": "multiple_choice", "json_call": "json_call"}
SEALED = [{**item, "evaluator": EVALUATOR[item["id"].rsplit("-", 1)[0]]} for item in ARITH + CHOICE + CALLS]


@pytest.fixture(scope="module")
def scanner() -> ContaminationScanner:
    return ContaminationScanner(SEALED, templates=[PROMPT_TEMPLATE])


def sft(question: str, answer: str) -> dict[str, str]:
    return {"prompt": PROMPT_TEMPLATE.replace("{question}", question), "completion": " " + answer}


def ids(matches: list[Match]) -> set[str]:
    return {m.sample_id for m in matches}


# --------------------------------------------------------------------------- this file's re-templates

ARITH_FORMS = [
    "Yusuf owns {a} kites. A friend hands over {b} more kites. Count the kites.",
    "{a} tulips were planted on Monday, {b} on Tuesday. How many tulips are in the bed?",
    "Compute the sum: first {a}, then another {b}.",
    "A crate has {a} melons; {b} more arrive. Melons now?",
]
ARITH_ANSWERS = ["{x}", "{a}+{b}={x}", "It comes to {x}.", "{x} in all"]


def arith_parts(item: dict[str, str]) -> tuple[int, int, int]:
    a, b = (int(x) for x in re.findall(r"\d+", item["prompt"])[:2])
    return a, b, int(item["answer"])


def options_of(item: dict[str, str]) -> tuple[str, list[str]]:
    options = re.findall(r"\b([A-D])\) (\S+)", item["prompt"])
    right = dict(options)[item["answer"]]
    return right, [w for _, w in options]


def retemplate(item: dict[str, str], rng: random.Random) -> dict[str, Any]:
    if item in ARITH:
        a, b, x = arith_parts(item)
        question = rng.choice(ARITH_FORMS).format(a=a, b=b)
        answer = rng.choice(ARITH_ANSWERS).format(a=a, b=b, x=x)
    elif item in CHOICE:
        right, words_ = options_of(item)
        rng.shuffle(words_)
        question = rng.choice(
            [
                "Options: {listed}. Point to {right}.",
                "{right} - find it among {listed}",
                "Here are four words ({listed}); which is {right}?",
            ]
        ).format(right=right, listed=", ".join(words_))
        answer = rng.choice([right, f"It is {right}.", f"{right}!"])
    else:
        call = json.loads(item["answer"])
        values = ", ".join(str(v) for v in call["arguments"].values())
        question = rng.choice(["Request with {v}.", "Do it for {v}, cheers", "{v} -- handle this"]).format(v=values)
        style = rng.randrange(3)
        if style == 0:
            answer = json.dumps(call, indent=1)
        elif style == 1:
            answer = json.dumps({"arguments": dict(sorted(call["arguments"].items())), "name": call["name"]})
        else:
            answer = call["name"] + "(" + ", ".join(repr(v) for v in call["arguments"].values()) + ")"
    shape = rng.randrange(3)
    if shape == 0:
        return {"prompt": question, "completion": " " + answer}
    if shape == 1:
        return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}
    return {"text": question + "\n\n" + answer}


def strings_changed(row: Any, change) -> Any:
    if isinstance(row, str):
        return change(row)
    if isinstance(row, dict):
        return {k: v if k == "role" else strings_changed(v, change) for k, v in row.items()}
    return [strings_changed(v, change) for v in row]


# --------------------------------------------------------------------------- API


def test_layers_constant_and_selection():
    assert LAYERS == ("exact", "ngram", "near_dup", "salient")
    alone = ContaminationScanner(SEALED, layers=("salient",))
    assert alone.layers == ("salient",)
    assert len(alone) == len(SEALED)
    item = ARITH[0]
    copy = sft(item["prompt"], item["answer"])
    assert [m.kind for m in alone.scan_row(copy)] == ["salient"]
    assert [m.kind for m in ContaminationScanner(SEALED, layers=("exact",)).scan([copy])] == ["exact"]
    assert (
        ContaminationScanner(SEALED, layers=("exact", "ngram", "near_dup")).scan([retemplate(item, random.Random(1))])
        == []
    )
    with pytest.raises(ValueError, match="layers"):
        ContaminationScanner(SEALED, layers=("embedding",))
    with pytest.raises(ValueError, match="layers"):
        ContaminationScanner(SEALED, layers=())


def test_the_evaluator_comes_from_the_item_or_the_constructor():
    plain = [{k: v for k, v in item.items() if k != "evaluator"} for item in CHOICE[:20]]
    item = CHOICE[0]
    right, words_ = options_of(item)
    row = {"text": f"{right}? pick from {' '.join(reversed(words_))}: {right}"}
    assert ids(ContaminationScanner(plain, evaluator="multiple_choice", layers=("salient",)).scan_row(row)) == {
        item["id"]
    }
    # Inferred from the shape (a letter answer, lettered options) when no evaluator is named.
    assert ids(ContaminationScanner(plain, layers=("salient",)).scan_row(row)) == {item["id"]}
    # An evaluator with no salient rule: the layer has nothing to match.
    assert ContaminationScanner(plain, evaluator="regex", layers=("salient",)).scan_row(row) == []


# --------------------------------------------------------------------------- attacks, per class


def test_verbatim_copies_are_exact_whatever_the_task(scanner):
    for item in ARITH[:5] + CHOICE[:5] + CALLS[:5]:
        [match] = scanner.scan_row(sft(item["prompt"], item["answer"]))
        assert (match.sample_id, match.kind) == (item["id"], "exact")


@pytest.mark.parametrize("variant", [homoglyph_variant, hidden_variant, number_variant])
def test_perturbed_verbatim_copies_stay_exact(scanner, variant):
    rng = random.Random(f"layers:{variant.__name__}")
    exact_only = ContaminationScanner(SEALED, layers=("exact",))
    for item in rng.sample(ARITH, 6) + rng.sample(CHOICE, 6) + rng.sample(CALLS, 6):
        prompt = variant(item["prompt"], rng)
        row = sft(prompt, item["answer"])
        assert item["id"] in ids(exact_only.scan_row(row)), prompt
        assert [(m.sample_id, m.kind) for m in scanner.scan_row(row)] == [(item["id"], "exact")], prompt


@pytest.fixture(scope="module")
def salient_only() -> ContaminationScanner:
    return ContaminationScanner(SEALED, templates=[PROMPT_TEMPLATE], layers=("salient",))


@pytest.mark.parametrize("seed", range(3))
def test_retemplated_copies_are_salient_matches(scanner, salient_only, seed):
    rng = random.Random(f"layers:retemplate:{seed}")
    for item in rng.sample(ARITH, 8) + rng.sample(CHOICE, 8) + rng.sample(CALLS, 8):
        row = retemplate(item, rng)
        # The salient layer finds every re-template by itself.
        assert ids(salient_only.scan_row(row)) == {item["id"]}, row
        matches = scanner.scan_row(row)
        assert ids(matches) == {item["id"]}, row
        # No surface layer but near_dup: a short item whose answer is most of its text ("Set an
        # alarm for 12:05." and its whole call, re-templated as "Request with 12:05." and that call)
        # is also a near duplicate of it, and the scanner reports the strongest match per item.
        assert matches[0].kind in ("near_dup", "salient"), matches


@pytest.mark.parametrize("variant", [homoglyph_variant, hidden_variant, number_variant])
def test_retemplated_and_perturbed_copies_are_still_found(scanner, variant):
    rng = random.Random(f"layers:retemplate+{variant.__name__}")
    for item in rng.sample(ARITH, 6) + rng.sample(CHOICE, 6) + rng.sample(CALLS, 6):
        row = retemplate(item, rng)
        if item in CALLS and variant is number_variant:
            row = strings_changed(row, lambda s: variant(s, rng) if not s.lstrip().startswith("{") else s)
        else:
            row = strings_changed(row, lambda s: variant(s, rng))
        assert ids(scanner.scan_row(row)) == {item["id"]}, row


def test_partial_copies_of_the_key_content_are_found(scanner):
    rng = random.Random("layers:partial")
    rows = []
    for item in rng.sample(ARITH, 5):
        a, b, x = arith_parts(item)
        rows.append(
            ({"text": rng.choice([f"{a} + {b} = {x}", f"{a}, {b} -> {x}", f"{words(a, rng)} plus {b}: {x}"])}, item)
        )
    for item in rng.sample(CHOICE, 5):
        right, words_ = options_of(item)
        rows.append(({"prompt": f"{right}? {' / '.join(words_)}", "completion": f" {right}"}, item))
    for item in rng.sample(CALLS, 5):
        call = json.loads(item["answer"])
        rows.append(({"text": item["answer"]}, item))  # the answer alone names the call and its arguments
        rows.append(
            ({"prompt": " ".join(str(v) for v in call["arguments"].values()), "completion": item["answer"]}, item)
        )
    for row, item in rows:
        assert ids(scanner.scan_row(row)) == {item["id"]}, row


def test_a_copy_split_over_datasets_is_found_in_each(scanner):
    rng = random.Random("layers:split")
    chosen = rng.sample(SEALED, 12)
    found: set[str] = set()
    for k in range(4):
        part = chosen[3 * k : 3 * k + 3]
        matches = scanner.scan([sft(item["prompt"], item["answer"]) for item in part])
        assert ids(matches) == {item["id"] for item in part}
        found |= ids(matches)
    assert len(found) == 12


def test_a_row_that_repeats_an_items_numbers_is_not_also_its_swapped_twin():
    # 20+62 and 62+20 are two sealed problems; a copy of the first restating its numbers
    # ("20 ... 62 ... 20 + 62 = 82") holds "62, 20 ... 82" too, which is not a copy of the second.
    sealed = [
        {"id": "x", "prompt": "Eli had 20 pens and found 62 more. How many pens in total?", "answer": "82"},
        {"id": "y", "prompt": "Mia had 62 cups and found 20 more. How many cups in total?", "answer": "82"},
    ]
    scanner = ContaminationScanner(sealed, layers=("salient",))
    assert ids(scanner.scan_row({"text": "A jar holds 20 beads; 62 more go in.\n20 + 62 = 82"})) == {"x"}
    assert ids(scanner.scan_row({"text": "20 + 62 = 82. And 62 + 20 = 82 as well."})) == {"x", "y"}


# --------------------------------------------------------------------------- hard negatives


def arith_negatives(rng: random.Random) -> list[dict[str, Any]]:
    sealed_pairs = {arith_parts(item)[:2] for item in ARITH}
    rows = []
    for item in rng.sample(ARITH, 10):
        a, b, x = arith_parts(item)
        form = rng.choice(ARITH_FORMS)
        rows.append(sft(form.format(a=a, b=b), str(x + rng.choice([-2, -1, 1, 10]))))  # same operands, wrong sum
        rows.append(sft(f"{a} boxes hold {b} eggs each. How many eggs?", str(a * b)))  # same operands, another problem
        # The sum first: a subtraction whose numbers are the item's, reordered.
        rows.append(sft(f"There were {x} birds; {a} flew off. How many stayed?", str(b)))
        if (b, a) not in sealed_pairs and a != b:
            rows.append(sft(form.format(a=b, b=a), str(x)))  # swapped: another problem, same sum
        c = next(c for c in range(10, 100) if (a, c) not in sealed_pairs and c != b)
        rows.append(sft(item["prompt"].replace(str(b), str(c), 1), str(a + c)))  # sealed sentence, one number new
    return rows


def choice_negatives(rng: random.Random) -> list[dict[str, Any]]:
    vocab = sorted({w for item in CHOICE for w in options_of(item)[1]})
    sealed_content = {(options_of(item)[0], frozenset(options_of(item)[1])) for item in CHOICE}
    rows = []
    for item in rng.sample(CHOICE, 10):
        right, words_ = options_of(item)
        # Same options, another of them asked for.
        other = rng.choice([w for w in words_ if w != right])
        if (other, frozenset(words_)) not in sealed_content:
            # The item's own sentence form (any of the task's), naming the other word before the list.
            stem, listed = item["prompt"].split(" A) ", 1)
            asked = re.sub(rf"\b{re.escape(right)}\b", other, stem) + " A) " + listed
            assert asked != item["prompt"], item
            rows.append(sft(asked, "ABCD"[words_.index(other)]))
        # Same word, other options.
        fresh = [w if w == right else rng.choice([v for v in vocab if v not in words_]) for w in words_]
        listed = " ".join(f"{'ABCD'[k]}) {w}" for k, w in enumerate(fresh))
        rows.append(sft(f"Which option is {right}? {listed}", "ABCD"[fresh.index(right)]))
        # The sealed sentence with every word new.
        new = rng.sample([v for v in vocab if v not in words_], 4)
        text = item["prompt"]
        for old, replacement in zip(words_, new, strict=True):
            text = re.sub(rf"\b{old}\b", replacement, text)
        rows.append(sft(text, item["answer"]))
    return rows


def call_negatives(rng: random.Random) -> list[dict[str, Any]]:
    sealed_answers = {json.dumps(json.loads(item["answer"]), sort_keys=True) for item in CALLS}
    rows = []
    for item in rng.sample(CALLS, 15):
        call = json.loads(item["answer"])
        args = dict(call["arguments"])
        prompt = item["prompt"]
        if call["name"] == "convert":
            swapped = prompt.replace(args["from"], "#").replace(args["to"], args["from"]).replace("#", args["to"])
            args = {**args, "from": args["to"], "to": args["from"]}
            new_prompt = swapped
        else:
            key = rng.choice(sorted(args))
            new_value = {"city": "Porto", "day": "someday", "time": "11:11", "to": "Quinn", "text": "farewell"}[key]
            new_prompt = prompt.replace(str(args[key]), new_value)
            args[key] = new_value
        answer = json.dumps({"name": call["name"], "arguments": args}, separators=(",", ":"))
        if json.dumps({"name": call["name"], "arguments": args}, sort_keys=True) not in sealed_answers:
            rows.append(sft(new_prompt, answer))
            rows.append({"text": f"{new_prompt} {answer}"})
    return rows


@pytest.mark.parametrize("make", [arith_negatives, choice_negatives, call_negatives])
@pytest.mark.parametrize("seed", range(3))
def test_hard_negatives_do_not_match(scanner, make, seed):
    rows = make(random.Random(f"layers:negatives:{make.__name__}:{seed}"))
    assert len(rows) >= 10
    assert scanner.scan(rows) == []


def test_honest_rows_from_the_generators_do_not_match(scanner):
    rng = random.Random("layers:honest")
    sealed_content = {content(item["id"].rsplit("-", 1)[0], item["prompt"], item["answer"]) for item in SEALED}
    rows = []
    while len(rows) < 1500:
        name = rng.choice(sorted(TASKS))
        item = TASKS[name].generate(rng)
        if content(name, item.question, item.answer) not in sealed_content:
            rows.append(sft(item.question, item.answer))
    assert scanner.scan(rows) == []


# --------------------------------------------------------------------------- other item shapes


def test_a_gsm8k_style_item_is_found_by_its_numbers_and_answer():
    items = [
        {
            "id": "gsm-1",
            "prompt": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
            "How much did she earn?",
            "answer": "Weng earns 12/60 = $0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $10.\n#### 10",
        },
        {
            "id": "gsm-2",
            "prompt": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May?",
            "answer": "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72",
        },
    ]
    scanner = ContaminationScanner(items, evaluator="exact_match", layers=("salient",))
    reworded = {
        "prompt": "A sitter is paid twelve dollars per hour and works fifty minutes. Pay?",
        "completion": " $10",
    }
    assert ids(scanner.scan_row(reworded)) == {"gsm-1"}
    assert scanner.scan_row({"prompt": "Paid 12 an hour for 50 minutes: how much?", "completion": " 11"}) == []
    assert scanner.scan_row({"prompt": "Paid 50 an hour for 12 minutes: how much?", "completion": " 10"}) == []
    # One number in the prompt is too little alone: the answer must follow it and most of the
    # prompt's words must be there.
    kept_words = {"text": "In April Natalia sold clips to 48 friends; half as many clips in May. Altogether: 72"}
    assert ids(scanner.scan_row(kept_words)) == {"gsm-2"}
    assert scanner.scan_row({"text": "A shop sold 48 lamps and later 72 more."}) == []


def test_an_mmlu_style_item_needs_its_question_not_only_its_options():
    item = {
        "id": "mmlu-1",
        "prompt": "What is the capital of Australia?\nA. Sydney\nB. Canberra\nC. Melbourne\nD. Perth",
        "answer": "B",
    }
    scanner = ContaminationScanner([item], evaluator="multiple_choice", layers=("salient",))
    copy = {"prompt": "Australia's capital city - Perth, Sydney, Canberra or Melbourne?", "completion": " Canberra"}
    assert ids(scanner.scan_row(copy)) == {"mmlu-1"}
    other_question = {
        "prompt": "Which is the largest city of Australia? Perth, Sydney, Canberra, Melbourne",
        "completion": " Sydney",
    }
    assert scanner.scan_row(other_question) == []
    other_options = {"prompt": "Capital of Australia: Canberra, Hobart, Darwin or Cairns?", "completion": " Canberra"}
    assert scanner.scan_row(other_options) == []


def test_a_copy_spread_over_chat_turns_with_extra_numbers_is_found(scanner):
    rng = random.Random("layers:turns")
    for item in rng.sample(ARITH, 6):
        a, b, x = arith_parts(item)
        row = {
            "messages": [
                {"role": "user", "content": f"At 9 I had {words(a, rng)} shells."},
                {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": f"Then {b} more came, in 2 bags. Total?"},
                {"role": "assistant", "content": f"{x}"},
            ]
        }
        assert ids(scanner.scan_row(row)) == {item["id"]}, row


def test_salient_spans_are_prompt_text_never_the_answer():
    sealed = [
        {"id": "n", "prompt": "Tom has 12 apples and gets 34 more. How many?", "answer": "46",
         "evaluator": "exact_match"},
        {"id": "c", "prompt": "What is the weather in Oslo now?", "evaluator": "json_call",
         "answer": '{"name":"get_weather","arguments":{"city":"Oslo","day":"today"}}'},
    ]  # fmt: skip
    scanner = ContaminationScanner(sealed, layers=("salient",))
    rows = [{"text": "12 + 34 = 46"}, {"text": "Oslo today -> get_weather(city='Oslo', day='today')"}]
    spans = {m.sample_id: m.span for m in scanner.scan(rows)}
    assert spans == {"n": "12 34", "c": "oslo"}


def test_multiple_choice_items_in_several_templates_keep_their_entity_apart_from_template_words():
    # Sealed stems in several sentence forms (as a benchmark with more templates has): the words
    # every form repeats are template words, the named word is the entity.
    rng = random.Random("layers:mc-templates")
    stems = ["Select the choice that names {w}.", "Which answer is the word {w}?", "Pick {w} from the list.",
             "Find the option reading {w}:"]  # fmt: skip
    vocab = sorted({w for item in CHOICE for w in options_of(item)[1]})
    sealed, seen = [], set()
    while len(sealed) < 80:
        words_ = rng.sample(vocab, 4)
        right = rng.choice(words_)
        if (right, frozenset(words_)) in seen:
            continue
        seen.add((right, frozenset(words_)))
        listed = " ".join(f"{'ABCD'[k]}) {w}" for k, w in enumerate(words_))
        prompt = rng.choice(stems).format(w=right) + " " + listed
        sealed.append({"id": f"mc-{len(sealed)}", "prompt": prompt, "answer": "ABCD"[words_.index(right)]})
    scanner = ContaminationScanner(sealed, evaluator="multiple_choice", layers=("salient",))
    for item in rng.sample(sealed, 10):
        options = re.findall(r"\b([A-D])\) (\S+)", item["prompt"])
        right = dict(options)[item["answer"]]
        words_ = [w for _, w in options]
        copy = {"prompt": f"Options {', '.join(reversed(words_))}: which one is {right}?", "completion": f" {right}"}
        assert ids(scanner.scan_row(copy)) == {item["id"]}
        other = next(w for w in words_ if w != right)
        if (other, frozenset(words_)) not in seen:
            asked = {"prompt": f"Options {', '.join(words_)}: which one is {other}?", "completion": f" {other}"}
            assert scanner.scan_row(asked) == []


_LABELS = ["Q", "Ex", "No", "Problem", "q", "Task"]


@pytest.mark.parametrize("seed", range(3))
def test_a_note_label_is_no_operand_and_hides_no_copy(scanner, seed):
    """Practice notes labelled "Q17: ..": the label counts notes. A note whose own operands are the
    sealed item's second operand and answer, under a label that is its first, is not that item; a
    sealed item's copy under any label is still found."""
    rng = random.Random(f"layers:label:{seed}")
    for item in rng.sample(ARITH, 10):
        a, b, x = arith_parts(item)
        label = rng.choice(_LABELS)
        close = rng.choice([":", ".", ")"])
        honest = f"{label}{a}{close} " + rng.choice(ARITH_FORMS).format(a=b, b=x) + f" A: {b + x}"
        others = [f"{rng.choice(_LABELS)}{n}{close} {n + 3} + {n + 40} = {2 * n + 43}" for n in range(1, 4)]
        assert item["id"] not in ids(scanner.scan_row({"text": "\n".join([*others, honest])})), honest
        copy = f"{label}{rng.randint(1, 99)}{close} " + rng.choice(ARITH_FORMS).format(a=a, b=b) + f" A: {x}"
        assert item["id"] in ids(scanner.scan_row({"text": "\n".join([*others, copy])})), copy


@pytest.mark.parametrize("seed", range(3))
def test_a_listed_call_is_read_by_its_arguments_whole(scanner, seed):
    """A list of calls as JSON: a sealed value inside a longer argument value ("yaw ym no" is not
    "no"), or a sealed value under another argument (from and to swapped), is not the sealed call;
    the sealed call itself in the list, keys in any order and spacing, is."""
    rng = random.Random(f"layers:calls-listed:{seed}")
    sealed_calls = {json.dumps(json.loads(item["answer"]), sort_keys=True) for item in CALLS}
    for item in rng.sample(CALLS, 12):
        call = json.loads(item["answer"])
        args = dict(call["arguments"])
        if call["name"] == "convert":
            args["from"], args["to"] = args["to"], args["from"]
        else:
            key = rng.choice([k for k, v in args.items() if isinstance(v, str)])
            args[key] = rng.choice(["yaw ym", "oh well", "see", "not"]) + " " + str(args[key])
        other = {"name": call["name"], "arguments": args}
        if json.dumps(other, sort_keys=True) in sealed_calls:
            continue
        filler = [json.dumps({"name": "set_alarm", "arguments": {"time": f"0{n}:1{n}"}}) for n in range(3)]
        listed = [*filler, json.dumps(other, separators=(",", ":"))]
        rng.shuffle(listed)
        assert item["id"] not in ids(scanner.scan_row({"prompt": "Calls:\n", "completion": "\n".join(listed)}))
        copy = {"arguments": dict(reversed(list(call["arguments"].items()))), "name": call["name"]}
        listed.insert(rng.randrange(len(listed) + 1), json.dumps(copy, indent=rng.choice([None, 1])).replace("\n", " "))
        assert item["id"] in ids(scanner.scan_row({"prompt": "Calls:\n", "completion": "\n".join(listed)}))
