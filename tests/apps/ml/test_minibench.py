"""The built minibench: layout contract, tokenizer, sealed-split hygiene and the honeypot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig, AutoTokenizer

from apps.benchmarks.minibench.build import MANIFEST_VERSION
from apps.benchmarks.minibench.catalog import build_task_data
from apps.benchmarks.minibench.task_specs import TASKS, number_words


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _sealed_questions(root: Path, task: str) -> dict[str, str]:
    rows = _jsonl(root / "tasks" / task / "feedback.jsonl") + _jsonl(root / "tasks" / task / "final.jsonl")
    return {row["id"]: row["prompt"] for row in rows}


def test_layout_follows_the_contract(minibench: Path) -> None:
    manifest = json.loads((minibench / "manifest.json").read_text())
    assert manifest["version"] == MANIFEST_VERSION
    assert (manifest["seed"], manifest["profile"], manifest["tasks"]) == (0, "ci", ["arithmetic"])
    assert manifest["theta0"] == "theta0"
    assert manifest["references"] == {"arithmetic": "references/arithmetic"}
    # 8 heads of 32 dims over a 128-wide stream, 5 layers, a 1,024-token vocabulary: ~1.6 M.
    assert 1.2e6 < manifest["theta0_params"] < 2.0e6
    for checkpoint in (minibench / "theta0", minibench / "references" / "arithmetic"):
        names = {p.name for p in checkpoint.iterdir()}
        assert {
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
        } <= names
        assert not any(n.endswith((".bin", ".pt", ".pth", ".pkl")) for n in names)
        assert AutoConfig.from_pretrained(checkpoint).model_type == "llama"
    task = json.loads((minibench / "tasks" / "arithmetic" / "task.json").read_text())
    assert task["evaluator"] == "exact_match"
    assert "{question}" in task["prompt_template"]
    assert task["decoding"]["do_sample"] is False
    assert task["use_chat_template"] is False
    feedback = _jsonl(minibench / "tasks" / "arithmetic" / "feedback.jsonl")
    assert feedback[0]["id"] == "arith-feedback-0001"
    assert set(feedback[0]) == {"id", "prompt", "answer"}
    for name in manifest["datasets"]:
        meta = json.loads((minibench / "catalog" / name / "meta.json").read_text())
        rows = _jsonl(minibench / "catalog" / name / "data.jsonl")
        assert meta["rows"] == len(rows) > 0
        assert meta["files"] == ["data.jsonl"]
        keys = {"prompt", "completion"} if meta["format"] == "sft" else {"prompt", "chosen", "rejected"}
        assert set(rows[0]) == keys
        assert (minibench / "catalog" / name / "README.md").read_text().startswith("---\n")
    qualities = {
        json.loads((minibench / "catalog" / n / "meta.json").read_text())["quality"] for n in manifest["datasets"]
    }
    assert qualities == {"clean", "noisy", "wrong_format", "irrelevant", "too_small", "honeypot"}


def test_tokenizer_round_trips_and_has_explicit_special_tokens(minibench: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(minibench / "theta0")
    specials = {tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token}
    assert specials == {"<pad>", "<s>", "</s>"}
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3
    texts = list(_sealed_questions(minibench, "arithmetic").values())
    texts += ['{"name":"f","arguments":{"x":1}}', "Tab\tand\nnewline", "café ünïcode ✓"]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # Digits are single tokens, so arithmetic is learnable digit by digit.
    assert tokenizer.tokenize("1234")[-4:] == ["1", "2", "3", "4"]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "User: hi\nAssistant:"


def test_clean_data_holds_no_sealed_prompt(minibench: Path) -> None:
    sealed = set(_sealed_questions(minibench, "arithmetic").values())
    for name in (
        "arithmetic-clean",
        "arithmetic-noisy",
        "arithmetic-wrongformat",
        "arithmetic-tiny",
        "arithmetic-prefs",
    ):
        for row in _jsonl(minibench / "catalog" / name / "data.jsonl"):
            assert not any(question in row["prompt"] for question in sealed), name


def test_honeypot_holds_sealed_items_verbatim_and_edited(minibench: Path) -> None:
    sealed = _sealed_questions(minibench, "arithmetic")
    prompts = [row["prompt"] for row in _jsonl(minibench / "catalog" / "arithmetic-honeypot" / "data.jsonl")]
    verbatim = {sid for sid, q in sealed.items() if any(q in p for p in prompts)}
    assert verbatim == set(sealed), "every feedback and final item appears verbatim"
    assert any(sid.startswith("arith-feedback-") for sid in verbatim)
    assert any(sid.startswith("arith-final-") for sid in verbatim)
    # Edited copies: not verbatim, but equal after normalising whitespace and spelled numbers.
    words = {number_words(n): str(n) for n in range(10, 100)}

    def normalise(text: str) -> str:
        text = " ".join(text.split())
        for word, digits in sorted(words.items(), key=lambda kv: -len(kv[0])):  # "twenty-three" before "twenty"
            text = text.replace(word, digits)
        return text

    wrapped = set(sealed.values())
    edited = [
        p for p in prompts if not any(q in p for q in wrapped) and any(normalise(q) in normalise(p) for q in wrapped)
    ]
    assert len(edited) >= 50


def test_data_is_deterministic_from_the_seed() -> None:
    first = build_task_data(TASKS["arithmetic"], seed=7, profile="ci")
    again = build_task_data(TASKS["arithmetic"], seed=7, profile="ci")
    other = build_task_data(TASKS["arithmetic"], seed=8, profile="ci")
    assert first.feedback == again.feedback
    assert [d.rows for d in first.datasets] == [d.rows for d in again.datasets]
    assert first.feedback != other.feedback


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_task_keeps_clean_data_disjoint_from_sealed(task: str) -> None:
    # The full profile's other tasks are not built in ci; their data generation still is checked.
    data = build_task_data(TASKS[task], seed=0, profile="full")
    sealed = {row["prompt"] for row in data.feedback + data.final}
    assert len(data.feedback) == len(data.final) == 200
    assert len(sealed) == 400
    clean = next(d for d in data.datasets if d.quality == "clean" and d.format == "sft")
    assert not any(row["prompt"].removeprefix("Question: ").removesuffix("\nAnswer:") in sealed for row in clean.rows)
    honeypot = next(d for d in data.datasets if d.quality == "honeypot")
    assert sealed <= {row["prompt"].removeprefix("Question: ").removesuffix("\nAnswer:") for row in honeypot.rows}
    assert any(d.format == "dpo" for d in data.datasets)
