"""The context rule both engines are called through (apps.ml.context), on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.benchmarks.contract import build_contract
from apps.ml.context import CONTEXT_RULE, fit, fit_prompts, model_context, within_context


@pytest.mark.parametrize(
    ("prompt_tokens", "max_tokens", "context", "allowed"),
    [(10, 32, 512, 32), (480, 32, 512, 32), (481, 32, 512, 31), (511, 32, 512, 1), (512, 32, 512, 0),
     (600, 32, 512, 0), (600, 32, None, 32)],
)  # fmt: skip
def test_new_tokens_never_take_the_prompt_past_the_context(prompt_tokens, max_tokens, context, allowed):
    fitted = fit(prompt_tokens, max_tokens, context)
    assert fitted.max_tokens == allowed
    assert fitted.over_context is (allowed == 0)
    if context is not None and allowed:
        assert prompt_tokens + fitted.max_tokens <= context


def test_each_prompt_gets_its_own_limit_and_one_with_no_room_never_reaches_the_engine():
    calls: list[tuple[list[str], int, list[int] | None]] = []

    def engine(batch: list[str], limit: int, seeds: list[int] | None) -> list[str]:
        calls.append((batch, limit, seeds))
        return [f"{p}:{limit}" for p in batch]

    fits = fit_prompts(["aaaa", "bb", "c", "aaaa"], count=len, max_tokens=8, context=6)
    capped = within_context(engine, fits)
    assert capped(["aaaa", "bb", "c", "aaaa", "bb"], 3, [1, 2, 3, 4, 5]) == [
        "aaaa:2", "bb:3", "c:3", "aaaa:2", "bb:3",
    ]  # fmt: skip
    assert calls == [(["bb", "c", "bb"], 3, [2, 3, 5]), (["aaaa", "aaaa"], 2, [1, 4])]
    over = fit_prompts(["xxxxxx"], count=len, max_tokens=8, context=6)
    calls.clear()
    assert within_context(engine, over)(["xxxxxx"], 8, None) == [""]
    assert calls == []


def test_the_context_is_the_configs_smallest_position_limit(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "seq_length": 2048}))
    assert model_context(tmp_path) == 2048
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 8192}}))
    assert model_context(tmp_path) == 8192
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert model_context(tmp_path) is None
    assert model_context(tmp_path / "missing") is None


def test_the_contract_states_the_rule():
    task = {"evaluator": "exact_match", "prompt_template": "{question}", "decoding": {"max_new_tokens": 8}}
    contract = build_contract(task, code_sha256={}, sample_counts={"final": 10}, packages=None, strict=False)
    assert contract["context"]["rule"] == CONTEXT_RULE
    assert "before either engine" in contract["context"]["statement"]
