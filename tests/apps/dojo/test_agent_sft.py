"""agent_sft on a tiny chat model built locally: masks, the end-of-turn rule, tool calls, loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from apps.ml.agent_sft import MaskedChatCollator, agent_sft_train, tokenize_example
from apps.ml.agent_sft_config import agent_sft_config
from apps.ml.checkpoints import load_checkpoint
from tests.support.tiny_chat import LEADING_END_TEMPLATE, build_tiny_chat_model

TOOLS = [{"type": "function", "function": {"name": "worker_submit", "description": "train and evaluate",
          "parameters": {"type": "object", "properties": {"learning_rate": {"type": "number"}}}}}]  # fmt: skip
CALL = {"type": "function", "function": {"name": "worker_submit", "arguments": {"learning_rate": 0.0001}}}


def _example(lr: float = 0.0001, *, masked_first: bool = False) -> dict:
    call = {"type": "function", "function": {"name": "worker_submit", "arguments": {"learning_rate": lr}}}
    return {
        "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "You improve models."},
            {"role": "user", "content": "Raise arithmetic accuracy."},
            {"role": "assistant", "content": "Let me look first.", "train": not masked_first},
            {"role": "user", "content": "Go on."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": '{"feedback_score": 0.42}'},
            {"role": "assistant", "content": "Score 0.42; next, diagnose the failures."},
        ],
    }


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    corpus = [json.dumps(_example(lr)) for lr in (0.0001, 0.0002, 0.0005)] * 20
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat") / "model", corpus)


def _trained_text(tokenizer, ids, mask) -> str:
    return tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])


def test_only_trained_assistant_turns_and_their_end_token_carry_loss(chat_model: Path):
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    config = agent_sft_config({})
    example = tokenize_example(_example(masked_first=True), tokenizer, config)
    learned = _trained_text(tokenizer, example["input_ids"], example["loss_mask"])
    assert "Score 0.42; next, diagnose the failures.<|end|>" in learned
    assert learned.count("<|end|>") == 2  # the two trained assistant turns, each closed
    for unlearned in ("You improve models.", "Raise arithmetic", "Let me look first.", "feedback_score", "Go on."):
        assert unlearned not in learned
    unmasked = tokenize_example(_example(), tokenizer, config)
    assert "Let me look first.<|end|>" in _trained_text(tokenizer, unmasked["input_ids"], unmasked["loss_mask"])


def test_tool_calls_round_trip_through_the_chat_template(chat_model: Path):
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    example = tokenize_example(_example(), tokenizer, agent_sft_config({}))
    learned = _trained_text(tokenizer, example["input_ids"], example["loss_mask"])
    call_text = learned.split("<tool_call>")[1].split("</tool_call>")[0]
    assert json.loads(call_text) == {"name": "worker_submit", "arguments": {"learning_rate": 0.0001}}
    full = tokenizer.decode(example["input_ids"])
    assert '"worker_submit"' in full.split("<|end|>")[0]  # the tools column is rendered for the model


def test_the_collator_turns_masks_into_labels_and_pads(chat_model: Path):
    collate = MaskedChatCollator(pad_token_id=0)
    batch = collate([{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, {"input_ids": [8], "loss_mask": [1]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_an_end_of_turn_token_outside_the_loss_is_an_error(tmp_path: Path):
    model = build_tiny_chat_model(
        tmp_path / "bad", ["<|user|>hi<|end|><|assistant|>hello"], template=LEADING_END_TEMPLATE
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    example = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    with pytest.raises(ValueError, match="end-of-turn token '<\\|end\\|>' falls outside"):
        tokenize_example(example, tokenizer, agent_sft_config({}))


def test_the_default_recipe_is_the_papers_and_bad_settings_are_refused():
    config = agent_sft_config({})
    assert (config.epochs, config.learning_rate, config.min_learning_rate) == (4, 1e-5, 2e-6)
    with pytest.raises(ValueError, match="unknown agent_sft setting"):
        agent_sft_config({"epoch": 3})
    with pytest.raises(ValueError, match="exceeds learning_rate"):
        agent_sft_config({"learning_rate": 1e-6})


def test_training_lowers_the_loss_on_assistant_turns(chat_model: Path, tmp_path: Path):
    data = tmp_path / "trajectories.jsonl"
    data.write_text("".join(json.dumps(_example(lr)) + "\n" for lr in (0.0001, 0.0002, 0.0005, 0.001)))
    losses: list[float] = []
    config = agent_sft_config({"epochs": 8, "learning_rate": 3e-3, "min_learning_rate": 3e-4,
                               "gradient_accumulation_steps": 1, "batch_size": 2})  # fmt: skip
    from apps.ml.training import TrainHooks  # noqa: PLC0415 - TRL; this test trains

    hooks = TrainHooks(on_log=lambda step, m: "loss" in m and losses.append(m["loss"]))
    result = agent_sft_train(config, base_dir=chat_model, data_files=[data], out_dir=tmp_path / "out", hooks=hooks)
    assert result.steps == 16
    assert losses[-1] < 0.8 * losses[0], losses
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "out" / "agent_sft.json").read_text())["examples"] == 4
    load_checkpoint(tmp_path / "out")  # a plain safetensors checkpoint with its tokenizer and template
    assert AutoTokenizer.from_pretrained(tmp_path / "out").chat_template
