"""Agent SFT: fine-tune a chat model on agent trajectories (RSI-Dojo), assistant turns only.

A trajectory example is TRL's conversational format with tools and per-message masks:

    {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": ...,
                   "tool_calls": [{"type": "function", "function": {"name", "arguments"}}],
                   "train": false}],          # optional on assistant turns: do not learn this one
     "tools": [<JSON schema of each tool>]}   # or its JSON text, as a datapool chat entry stores it

Datapool ``chat`` entries (apps.dojo.export) are read as they are: TRL prompt-completion rows (the
prompt's messages untrained, the completion trained), tools as JSON text, tool-call arguments as
JSON text (parsed here), a ``metadata`` column (ignored) (`normalize_example`).

`tokenize_example` renders the conversation with the tokenizer's chat template and marks the
tokens of every assistant turn that is trained (its content, its tool calls and its end-of-turn
token); `MaskedChatCollator` turns those marks into labels (-100 elsewhere). A trained turn
whose end-of-turn token falls outside its span is an error, not a warning: a model trained so
never learns to stop its turn. The default recipe is the RSI-Dojo paper's: 4 epochs, learning
rate 1e-5 decaying (cosine) to 2e-6.
"""

from __future__ import annotations

import apps.ml.offline  # noqa: F401 - before transformers: the Hub stays off

# isort: split
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import PreTrainedTokenizerBase
from trl import SFTConfig, SFTTrainer  # type: ignore[attr-defined]

from apps.ml.agent_sft_config import AgentSFTConfig
from apps.ml.checkpoints import load_checkpoint
from apps.ml.hparams import TrainConfig
from apps.ml.training import (
    TrainHooks,
    TrainResult,
    _HooksCallback,
    _read_jsonl,
    _trainer_args,
    publish_checkpoint,
    refuse_non_empty,
    run_trainer,
    staging_dir,
)

ROLES = ("system", "user", "assistant", "tool")


def _check_example(index: int, example: dict[str, Any]) -> list[dict[str, Any]]:
    messages = example.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"example {index}: needs a non-empty 'messages' list")
    for j, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ValueError(f"example {index} message {j}: role must be one of {list(ROLES)}")
        if "train" in message and not isinstance(message["train"], bool):
            raise ValueError(f"example {index} message {j}: 'train' must be true or false")
    if not any(m["role"] == "assistant" and m.get("train", True) for m in messages):
        raise ValueError(f"example {index}: no assistant turn to learn (all masked or none present)")
    return messages


def normalize_example(example: dict[str, Any]) -> dict[str, Any]:
    """An exported conversation (a datapool ``chat`` row, or one read back by ``datasets``) as the
    chat template wants it: ``tools`` parsed from its JSON text, keys that Arrow filled with null
    dropped, and tool-call arguments parsed from JSON text to objects (as HF chat templates expect).

    A prompt-completion row (TRL's form, as apps.dojo.export writes it) becomes one conversation
    whose completion alone is trained."""
    if "messages" not in example and isinstance(example.get("prompt"), list):
        prompt = [{**m, "train": False} if isinstance(m, dict) else m for m in example["prompt"]]
        completion = [{**m, "train": True} if isinstance(m, dict) else m for m in example.get("completion") or []]
        example = {k: v for k, v in example.items() if k not in ("prompt", "completion")}
        example["messages"] = prompt + completion
    tools = example.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise ValueError(f"'tools' is not JSON text: {exc}") from exc
    messages = []
    for message in example.get("messages") or []:
        if not isinstance(message, dict):
            messages.append(message)
            continue
        message = {k: v for k, v in message.items() if v is not None}
        calls = []
        for call in message.get("tool_calls") or []:
            function = dict(call.get("function") or {}) if isinstance(call, dict) else {}
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments)
                except json.JSONDecodeError:
                    parsed = None
                if isinstance(parsed, dict):
                    function["arguments"] = parsed
            calls.append({**call, "function": function} if isinstance(call, dict) else call)
        if calls:
            message["tool_calls"] = calls
        else:
            message.pop("tool_calls", None)
        messages.append(message)
    return {**example, "messages": messages, "tools": tools}


def _render(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], tools: Any, *, prompt: bool
) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=prompt, tokenize=False)
    # The template writes every special token itself (BOS included, if it has one).
    return list(tokenizer(str(text), add_special_tokens=False)["input_ids"])


def end_of_turn_id(tokenizer: PreTrainedTokenizerBase, config: AgentSFTConfig) -> int:
    token = config.end_of_turn_token or tokenizer.eos_token
    if not token:
        raise ValueError("the tokenizer has no EOS token; name the end-of-turn token (end_of_turn_token)")
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
        raise ValueError(f"end-of-turn token {token!r} is not in the vocabulary")
    return token_id


def tokenize_example(
    example: dict[str, Any], tokenizer: PreTrainedTokenizerBase, config: AgentSFTConfig, *, index: int = 0
) -> dict[str, list[int]]:
    """Token ids and a loss mask (1 = learned) for one conversation.

    Each assistant turn's span is what the template adds between the conversation before it
    (with the generation prompt) and the conversation through it. The template must render
    prefixes stably; one that does not is refused, since its spans would be wrong.
    """
    example = normalize_example(example)
    messages = _check_example(index, example)
    tools = example.get("tools")
    eot = end_of_turn_id(tokenizer, config)
    input_ids = _render(tokenizer, messages, tools, prompt=False)
    mask = [0] * len(input_ids)
    for j, message in enumerate(messages):
        if message["role"] != "assistant" or not message.get("train", True):
            continue
        before = _render(tokenizer, messages[:j], tools, prompt=True) if j else []
        through = _render(tokenizer, messages[: j + 1], tools, prompt=False)
        if input_ids[: len(through)] != through or through[: len(before)] != before:
            raise ValueError(f"example {index} message {j}: the chat template does not render prefixes stably")
        span = range(len(before), len(through))
        if eot not in [through[k] for k in span]:
            raise ValueError(
                f"example {index} message {j}: the end-of-turn token {tokenizer.convert_ids_to_tokens(eot)!r} "
                "falls outside the assistant turn's loss; the model would never learn to end its turn. "
                "Fix the chat template (the turn must end with it) or set end_of_turn_token."
            )
        for k in span:
            mask[k] = 1
    if len(input_ids) > config.max_length:
        raise ValueError(f"example {index}: {len(input_ids)} tokens exceed max_length={config.max_length}")
    return {"input_ids": input_ids, "loss_mask": mask}


class MaskedChatCollator:
    """Pads a batch; labels are the input ids where the loss mask is 1 and -100 elsewhere."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        width = max(len(f["input_ids"]) for f in features)
        ids, labels, attention = [], [], []
        for f in features:
            pad = width - len(f["input_ids"])
            ids.append(list(f["input_ids"]) + [self.pad_token_id] * pad)
            labels.append(
                [t if m else -100 for t, m in zip(f["input_ids"], f["loss_mask"], strict=True)] + [-100] * pad
            )
            attention.append([1] * len(f["input_ids"]) + [0] * pad)
        return {
            "input_ids": torch.tensor(ids),
            "labels": torch.tensor(labels),
            "attention_mask": torch.tensor(attention),
        }


def _args(config: AgentSFTConfig, output_dir: Path) -> dict[str, Any]:
    """The post-training arguments (device, saving, logging) with epochs and the decaying schedule."""
    shared = TrainConfig(
        learning_rate=config.learning_rate,
        batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        max_length=config.max_length,
        seed=config.seed,
        logging_steps=config.logging_steps,
    )
    return {
        **_trainer_args(shared, output_dir),
        "max_steps": -1,  # epochs decide
        "num_train_epochs": config.epochs,
        "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr": config.min_learning_rate},
        # transformers 5 reads a float below 1 as a fraction of the steps (warmup_ratio is gone).
        "warmup_steps": config.warmup_ratio if config.warmup_ratio > 0 else 0,
        "remove_unused_columns": False,
        # Tokenized and masked here; TRL must not re-tokenize or append EOS.
        "dataset_kwargs": {"skip_prepare_dataset": True},
    }


def agent_sft_train(
    config: AgentSFTConfig,
    *,
    base_dir: Path,
    data_files: list[Path],
    out_dir: Path,
    hooks: TrainHooks | None = None,
) -> TrainResult:
    """Fine-tune the chat model in `base_dir` on trajectory files; write a full model to `out_dir`.

    Every example is tokenized and checked before any step runs (a bad one is a ValueError
    naming it). `out_dir` appears only when training completes.
    """
    hooks = hooks or TrainHooks()
    refuse_non_empty(out_dir)
    torch.set_num_threads(config.num_threads)
    model, tokenizer = load_checkpoint(base_dir)
    if not tokenizer.chat_template:
        raise ValueError("agent_sft needs a base model with a chat template")
    rows = _read_jsonl(data_files)
    tokenized = [tokenize_example(row, tokenizer, config, index=i) for i, row in enumerate(rows)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_of_turn_id(tokenizer, config)
    callback = _HooksCallback(hooks)
    started = time.monotonic()
    with staging_dir(out_dir) as staging:
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(**_args(config, staging / "trainer")),
            train_dataset=datasets.Dataset.from_list(tokenized),
            processing_class=tokenizer,
            data_collator=MaskedChatCollator(pad_id),
            callbacks=[callback],
        )
        run_trainer(trainer, callback, "agent training")
        model_dir = staging / "model"
        trained: Any = trainer.model
        trained.save_pretrained(model_dir)
        (model_dir / "agent_sft.json").write_text(
            json.dumps({"recipe": dataclasses.asdict(config), "examples": len(tokenized)}, indent=2) + "\n",
            encoding="utf-8",
        )
        return publish_checkpoint(
            model_dir,
            base_dir=base_dir,
            out_dir=out_dir,
            trainer=trainer,
            callback=callback,
            hooks=hooks,
            started=started,
        )
