"""Minibench v2: disjoint template families, salient-content disjointness, the θ0 shape, task variants.

The checks read the generated text back with parsers written here from the templates, not with
the generators' own keys, so a generator that wrote a sealed form or a sealed item's content into
catalog data would be caught even if it labelled it otherwise.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from apps.benchmarks.minibench import build_task_variants, write_task_variants
from apps.benchmarks.minibench.build import MANIFEST_VERSION
from apps.benchmarks.minibench.catalog import SIZES, TaskData, build_task_data
from apps.benchmarks.minibench.model import make_config
from apps.benchmarks.minibench.task_specs import (
    CATALOG,
    CATEGORIES,
    CITIES,
    DAYS,
    JSON_FORMS,
    NAMES,
    SEALED,
    SIDES,
    TASKS,
    WORDS,
)
from apps.benchmarks.minibench.tokenizer import train_tokenizer
from apps.benchmarks.minibench.variants import EXPECTATIONS
from apps.ml import evaluators

_SLOT = re.compile(r"\\\{(\w+)\\\}")


def _form_regex(template: str) -> re.Pattern[str]:
    """A template as a regex: each {slot} a named group (repeated slots must repeat the value)."""
    seen: set[str] = set()

    def group(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return f"(?P={name})"
        seen.add(name)
        return f"(?P<{name}>.+?)"

    return re.compile("^" + _SLOT.sub(group, re.escape(template)) + "$")


def _sides_of(task: str, question: str) -> set[str]:
    forms = TASKS[task].forms
    return {side for side in SIDES for form in forms[side] if _form_regex(form).match(question)}


def _question(prompt: str) -> str:
    return prompt.removeprefix("Question: ").removesuffix("\nAnswer:")


_OPTION = re.compile(r"([A-D])\) (\S+)")


def _salient(task: str, question: str) -> tuple[Any, ...] | None:
    """The key content of an item, read from its question: what a re-templated copy would keep.

    Arithmetic: the operands in order (they fix the answer); multiple choice: the entity and the
    option set; function calls: the name and arguments the request asks for.
    """
    if task == "arithmetic":
        numbers = tuple(int(n) for n in re.findall(r"\d+", question))
        return numbers if len(numbers) == 2 else None
    forms = JSON_FORMS if task == "json_call" else {"": TASKS[task].forms}
    for kind, by_side in forms.items():
        for side in SIDES:
            for form in by_side[side]:
                match = _form_regex(form).match(question)
                if not match:
                    continue
                slots = match.groupdict()
                if task == "multiple_choice":
                    options = _OPTION.findall(question)
                    return (slots["w"], frozenset(w for _, w in options)) if len(options) == 4 else None
                return (kind, json.dumps(_call_arguments(kind, slots), sort_keys=True))
    return None


def _call_arguments(kind: str, slots: dict[str, str]) -> dict[str, Any]:
    if kind == "get_weather":
        return {"city": slots["c"], "day": slots["d"]}
    if kind == "set_alarm":
        return {"time": slots["t"]}
    if kind == "send_message":
        return {"to": slots["n"], "text": slots["w"]}
    amount = slots["amount"]
    return {"amount": int(amount) if amount.isdigit() else amount, "from": slots["src"], "to": slots["dst"]}


def _consistent(task: str, content: tuple[Any, ...], answer: str) -> bool:
    """The gold answer agrees with the content read from the question (the parser is right)."""
    if task == "arithmetic":
        return answer == str(sum(content))
    if task == "multiple_choice":
        return len(answer) == 1 and answer in "ABCD"
    call = json.loads(answer)
    return (call["name"], json.dumps(call["arguments"], sort_keys=True)) == content


def _sealed(data: TaskData) -> list[dict[str, str]]:
    return data.feedback + data.final


@pytest.fixture(scope="module", params=sorted(TASKS))
def full_data(request: pytest.FixtureRequest) -> tuple[str, Any]:
    return request.param, build_task_data(TASKS[request.param], seed=0, profile="full")


def test_the_two_template_families_share_no_form() -> None:
    for name, task in TASKS.items():
        assert set(task.forms) == set(SIDES)
        assert task.forms[CATALOG], name
        assert task.forms[SEALED], name
        assert not set(task.forms[CATALOG]) & set(task.forms[SEALED]), name
        # No form of one side reads as a form of the other (a regex of one matching the other's
        # rendering would make the families indistinguishable in the data).
        for side, other in ((CATALOG, SEALED), (SEALED, CATALOG)):
            for form in task.forms[side]:
                sample = re.sub(r"\{\w+\}", "X", form)
                assert not any(_form_regex(o).match(sample) for o in task.forms[other]), (name, form)


def test_sealed_splits_use_sealed_forms_and_catalog_data_catalog_forms(full_data: tuple[str, Any]) -> None:
    task, data = full_data
    sealed = _sealed(data)
    assert len(sealed) == 400
    assert all(_sides_of(task, row["prompt"]) == {SEALED} for row in sealed)
    # Every sealed form is used, so the families are real, not one form relabelled.
    used = Counter(next(f for f in TASKS[task].forms[SEALED] if _form_regex(f).match(row["prompt"])) for row in sealed)
    assert set(used) == set(TASKS[task].forms[SEALED])
    for ds in data.datasets:
        if ds.quality == "irrelevant":
            continue
        forms = Counter(frozenset(_sides_of(task, _question(row["prompt"]))) for row in ds.rows)
        if ds.quality == "honeypot":
            # Its honest part is in catalog forms; every other row is a planted sealed copy.
            assert forms[frozenset({CATALOG})] == SIZES["full"].honeypot_clean, ds.name
            assert sum(forms.values()) - forms[frozenset({CATALOG})] == len(sealed) + SIZES["full"].honeypot_edited
        else:
            assert forms == {frozenset({CATALOG}): len(ds.rows)}, ds.name


def test_catalog_data_shares_no_salient_content_with_sealed_items(full_data: tuple[str, Any]) -> None:
    task, data = full_data
    sealed_rows = _sealed(data)
    sealed = {_salient(task, row["prompt"]) for row in sealed_rows}
    assert None not in sealed
    assert len(sealed) == 400, "sealed items have pairwise distinct key content"
    assert all(_consistent(task, _salient(task, r["prompt"]), r["answer"]) for r in sealed_rows)  # type: ignore[arg-type]
    for ds in data.datasets:
        if ds.quality in ("irrelevant", "honeypot"):
            continue
        for row in ds.rows:
            content = _salient(task, _question(row["prompt"]))
            assert content is not None, (ds.name, row)
            assert content not in sealed, (ds.name, row)
            if ds.quality == "clean" and ds.format == "sft":
                assert _consistent(task, content, row["completion"].strip()), (ds.name, row)
    # The honeypot does carry them (the parser sees sealed content when it is there).
    honeypot = next(d for d in data.datasets if d.quality == "honeypot")
    assert sealed <= {_salient(task, _question(r["prompt"])) for r in honeypot.rows}


def test_the_vocabularies_leave_most_entity_answer_pairs_to_the_catalog() -> None:
    words = [w for ws in CATEGORIES.values() for w in ws]
    assert len(words) == len(set(words)), "an option word in two categories would make two answers right"
    sealed_full = 400
    assert len(words) * 4 >= 2 * sealed_full  # (entity, letter) pairs for multiple choice
    # Function-call kinds get ~1/4 of the sealed items each; each needs far more distinct calls.
    assert len(CITIES) * len(DAYS) >= 4 * sealed_full // 4
    assert len(NAMES) * len(WORDS) >= 4 * sealed_full // 4


def test_theta0_has_head_dim_32_and_runs() -> None:
    tokenizer = train_tokenizer(["Question: Tom has 12 apples and gets 34 more.\nAnswer: 46"] * 20, vocab_size=300)
    config = make_config(tokenizer)
    assert config.head_dim == 32  # vLLM's CPU attention refuses 16
    assert config.num_attention_heads == 8
    assert config.num_key_value_heads == config.num_attention_heads
    from transformers import LlamaForCausalLM  # noqa: PLC0415 - heavy, this test only

    model = LlamaForCausalLM(config)
    ids = tokenizer(["Question: 1 + 2\nAnswer:"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert model.model.layers[0].self_attn.q_proj.out_features == 8 * 32


@pytest.fixture(scope="module")
def variants() -> list[Any]:
    return build_task_variants(seed=0, tasks=list(TASKS))


def test_variants_are_deterministic_and_cover_every_filter_outcome(variants: list[Any]) -> None:
    again = build_task_variants(seed=0, tasks=list(TASKS))
    assert [v.meta() for v in variants] == [v.meta() for v in again]
    assert [v.items for v in variants] == [v.items for v in again]
    other = build_task_variants(seed=1, tasks=["arithmetic"])
    assert variants[0].items != other[0].items
    assert {v.expect for v in variants} == set(EXPECTATIONS)
    names = [v.name for v in variants]
    assert len(names) == len(set(names))
    ids = [item["id"] for v in variants for item in v.items]
    assert len(ids) == len(set(ids)), "item ids are unique across variants"
    assert {v.base_task for v in variants} == set(TASKS)


def test_variant_sizes_and_metadata_match_what_they_expect(variants: list[Any]) -> None:
    for variant in variants:
        meta = variant.meta()
        assert meta["items"] == len(variant.items) == sum(meta["subset_sizes"].values())
        assert {item["subset"] for item in variant.items} == set(variant.subsets)
        for contract in variant.subsets.values():
            assert contract["evaluator"] in evaluators.EVALUATORS
            assert "{question}" in contract["prompt_template"]
            assert isinstance(contract["decoding"], dict)
        if variant.expect == "too_small":
            assert len(variant.items) < 50
        elif variant.expect == "downsample":
            assert len(variant.items) > 300
        else:
            assert 50 <= len(variant.items) <= 300, variant.name
        sampled = any(c["decoding"].get("do_sample") for c in variant.subsets.values())
        assert sampled == (variant.expect == "unstable"), variant.name
        evaluators_used = {c["evaluator"] for c in variant.subsets.values()}
        assert (len(variant.subsets) > 1 and len(evaluators_used) > 1) == (variant.expect == "split"), variant.name


def test_the_blind_metric_never_moves_and_the_others_do(variants: list[Any]) -> None:
    rng = random.Random(0)
    for variant in variants:
        for subset, contract in variant.subsets.items():
            items = [it for it in variant.items if it["subset"] == subset]
            answers = [it["answer"] for it in items]
            shuffled = rng.sample(answers, len(answers))

            def score(outputs: list[str], contract: dict[str, Any] = contract, items: list[Any] = items) -> float:
                pairs = zip(outputs, items, strict=True)
                return sum(evaluators.score(contract["evaluator"], o, it["answer"]) for o, it in pairs) / len(items)

            perfect, blank, mixed = score(answers), score([""] * len(items)), score(shuffled)
            if variant.expect == "metric_ignores_output":
                assert perfect == blank == mixed == 0.0
            else:
                assert perfect == 1.0, (variant.name, subset)
                assert blank == 0.0
                assert mixed < 0.5


def test_no_variant_item_shares_a_sealed_items_content(variants: list[Any]) -> None:
    for task in TASKS:
        sealed_rows = _sealed(build_task_data(TASKS[task], seed=0, profile="full"))
        sealed = {_salient(task, row["prompt"]) for row in sealed_rows}
        sealed_prompts = {row["prompt"] for row in sealed_rows}
        checked = 0
        for variant in variants:
            if variant.base_task != task:
                continue
            for item in variant.items:
                assert item["prompt"] not in sealed_prompts
                if variant.subsets[item["subset"]]["evaluator"] == TASKS[task].evaluator:
                    content = _salient(task, item["prompt"])
                    assert content is not None, (variant.name, item)
                    assert content not in sealed, (variant.name, item)
                    checked += 1
        assert checked >= 200, task


def test_the_hard_and_extended_variants_differ_from_the_base_task(variants: list[Any]) -> None:
    by_name = {v.name: v for v in variants}
    hard = by_name["arithmetic-three-digit"]
    assert hard.difficulty == "hard"
    assert all(min(int(n) for n in re.findall(r"\d+", it["prompt"])) >= 100 for it in hard.items)
    vocab = by_name["arithmetic-extended-vocab"]
    standard_words = set(NAMES) | {w for form in TASKS["arithmetic"].forms[SEALED] for w in form.split()}
    standard_words |= {"apples", "books", "coins", "pens", "cards", "shells", "stamps", "eggs", "cups", "rocks"}
    first_words = {it["prompt"].split()[0] for it in vocab.items}
    nouns = {it["prompt"].split()[3] for it in vocab.items if it["prompt"].split()[0] in first_words}
    assert vocab.vocabulary == "extended"
    assert any(word not in standard_words for word in first_words | nouns)
    for variant in variants:
        if variant.templates in SIDES:
            assert all(_sides_of(variant.base_task, it["prompt"]) == {variant.templates} for it in variant.items), (
                variant.name
            )


def test_the_built_minibench_is_v2(built_minibench: Path) -> None:
    manifest = json.loads((built_minibench / "manifest.json").read_text())
    assert manifest["version"] == MANIFEST_VERSION == 2
    config = json.loads((built_minibench / "theta0" / "config.json").read_text())
    assert config["head_dim"] == 32
    assert config["num_attention_heads"] == 8
    assert manifest["theta0_config"]["head_dim"] == 32
    for task in manifest["tasks"]:
        assert manifest["templates"][task] == {side: list(TASKS[task].forms[side]) for side in SIDES}
        feedback = [json.loads(line) for line in (built_minibench / "tasks" / task / "feedback.jsonl").open()]
        assert all(_sides_of(task, row["prompt"]) == {SEALED} for row in feedback)
    assert "variants" not in manifest  # generated on demand, not part of a build
    assert not (built_minibench / "variants").exists()


def test_variants_are_written_as_readable_folders(tmp_path: Path, variants: list[Any]) -> None:
    chosen = [v for v in variants if v.base_task == "arithmetic"]
    names = write_task_variants(tmp_path, chosen)
    assert names == [v.name for v in chosen]
    for variant in chosen:
        folder = tmp_path / variant.name
        meta = json.loads((folder / "variant.json").read_text())
        rows = [json.loads(line) for line in (folder / "items.jsonl").open()]
        assert meta == json.loads(json.dumps(variant.meta()))
        assert rows == variant.items
        assert meta["expect"] in EXPECTATIONS
    with pytest.raises(FileExistsError):
        write_task_variants(tmp_path, chosen[:1])
