"""Post-training (SFT / DPO, full or LoRA) of a local checkpoint with TRL, behind `TrainHooks`.

Apart from `inference` on purpose: TRL and PEFT are heavy, and evaluation-only workers never
import this module.
"""

from __future__ import annotations

import apps.ml.offline  # noqa: F401 - before transformers: the Hub stays off

# isort: split
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from peft import LoraConfig
from transformers import PreTrainedTokenizerBase, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import PrinterCallback
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer  # type: ignore[attr-defined]

from apps.core.jsonsafe import first_bad_value
from apps.core.jsonsafe import loads as jsonsafe_loads
from apps.ml.checkpoints import TOKENIZER_FILES, load_checkpoint
from apps.ml.hparams import TrainConfig
from apps.ml.row_format import FORMAT_KEYS

# Progress goes through TrainHooks; dataset-map progress bars would only clutter job logs.
datasets.disable_progress_bar()


class Cancelled(Exception):
    """Training stopped because `TrainHooks.should_stop()` said so; no checkpoint was written."""


@dataclass
class TrainHooks:
    """Callbacks from a running training job to its owner (job row, websocket, cancel flag)."""

    on_log: Callable[[int, dict[str, float]], None] | None = None
    should_stop: Callable[[], bool] | None = None
    on_progress: Callable[[float], None] | None = None
    heartbeat: Callable[[], None] | None = None


@dataclass(frozen=True)
class TrainResult:
    steps: int
    final_loss: float
    tokens_per_second: float
    seconds: float
    out_dir: Path


def _read_jsonl(paths: Sequence[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = jsonsafe_loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path.name}:{lineno}: not valid JSON ({exc.msg})") from None
                except RecursionError:
                    raise ValueError(f"{path.name}:{lineno}: nested too deeply") from None
                # The datapool refuses such rows at registration; a file changed since must not
                # train on a NaN or a lone surrogate either (the tokenizer and the logs would choke).
                bad = first_bad_value(row)
                if bad is not None:
                    raise ValueError(f"{path.name}:{lineno}: {bad.message}")
                rows.append(row)
    if not rows:
        raise ValueError("the training data is empty")
    return rows


_FORMAT_KEYS = FORMAT_KEYS  # the fields by name, shared with the contamination scanner


def _check_rows(rows: list[dict[str, Any]], recipe: str) -> None:
    keys = _FORMAT_KEYS[recipe]
    for i, row in enumerate(rows):
        missing = [k for k in keys if not isinstance(row.get(k), str)]
        if missing:
            other = "dpo" if recipe == "sft" else "sft"
            hint = (
                f" (this looks like {other} data)"
                if all(isinstance(row.get(k), str) for k in _FORMAT_KEYS[other])
                else ""
            )
            raise ValueError(f"row {i}: recipe {recipe!r} needs string fields {list(keys)}, missing {missing}{hint}")


def _to_conversational(rows: list[dict[str, Any]], recipe: str) -> list[dict[str, Any]]:
    """Wrap plain rows as chat messages so TRL renders them with the tokenizer's chat template."""

    def assistant(text: str) -> list[dict[str, str]]:
        # The plain-text completions start with the space that follows "Answer:"; a chat turn
        # carries its own separator.
        return [{"role": "assistant", "content": text.strip()}]

    out = []
    for row in rows:
        conv: dict[str, Any] = {"prompt": [{"role": "user", "content": row["prompt"]}]}
        for key in _FORMAT_KEYS[recipe][1:]:
            conv[key] = assistant(row[key])
        out.append(conv)
    return out


def _pretokenize_without_eos(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, max_length: int, *, add_special_tokens: bool
) -> list[dict[str, list[int]]]:
    """Tokenize prompt+completion with no EOS, as a hand-rolled pipeline often does.

    TRL treats a dataset with `input_ids` as already processed and appends nothing, so the model
    never sees where an answer ends. This is `eos_handling="none"`, kept as an explicit option
    because it is one of the most common real post-training bugs.
    """
    out = []
    for row in rows:
        prompt_ids = tokenizer(row["prompt"], add_special_tokens=add_special_tokens)["input_ids"]
        full_ids = tokenizer(row["prompt"] + row["completion"], add_special_tokens=add_special_tokens)["input_ids"]
        full_ids = full_ids[:max_length]
        labels = [-100] * len(prompt_ids) + full_ids[len(prompt_ids) :]
        out.append({"input_ids": full_ids, "labels": labels[: len(full_ids)]})
    return out


class _HooksCallback(TrainerCallback):
    """Bridges the HF Trainer loop to `TrainHooks`, including cooperative cancel."""

    def __init__(self, hooks: TrainHooks) -> None:
        self.hooks = hooks
        self.cancelled = False
        self.started = time.monotonic()
        self.last_loss = float("nan")

    def _check_stop(self, control: TrainerControl) -> None:
        if self.hooks.should_stop is not None and self.hooks.should_stop():
            self.cancelled = True
            # The Trainer finishes the current step and returns; train() then raises Cancelled.
            control.should_training_stop = True

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.started = time.monotonic()
        self._check_stop(control)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.hooks.heartbeat is not None:
            self.hooks.heartbeat()
        if self.hooks.on_progress is not None and state.max_steps:
            self.hooks.on_progress(min(1.0, state.global_step / state.max_steps))
        self._check_stop(control)

    def tokens_per_second(self, state: TrainerState) -> float:
        elapsed = time.monotonic() - self.started
        return float(state.num_input_tokens_seen) / elapsed if elapsed > 0 else 0.0

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        metrics = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, int | float)}
        if "loss" in metrics:
            self.last_loss = metrics["loss"]
        metrics["tokens_per_second"] = self.tokens_per_second(state)
        if self.hooks.on_log is not None:
            self.hooks.on_log(state.global_step, metrics)


def refuse_non_empty(out_dir: Path) -> None:
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"output directory {out_dir} is not empty")


@contextmanager
def staging_dir(out_dir: Path) -> Iterator[Path]:
    """A private folder beside `out_dir` for the Trainer's files and the model; removed whatever happens."""
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def run_trainer(trainer: Any, callback: _HooksCallback, what: str) -> None:
    """Train with progress through the hooks (not stdout); `Cancelled` when the hooks asked to stop."""
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    if callback.cancelled:
        raise Cancelled(f"{what} cancelled at step {trainer.state.global_step}")


def publish_checkpoint(
    model_dir: Path,
    *,
    base_dir: Path,
    out_dir: Path,
    trainer: Any,
    callback: _HooksCallback,
    hooks: TrainHooks,
    started: float,
) -> TrainResult:
    """The shared end of every training: the base's tokenizer files beside the weights, then `out_dir`
    appears at once and complete (a rename on the same filesystem), and the result is reported."""
    for name in TOKENIZER_FILES:
        if (base_dir / name).is_file():
            shutil.copy2(base_dir / name, model_dir / name)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.exists():
        out_dir.rmdir()  # checked empty before training
    model_dir.rename(out_dir)
    if hooks.on_progress is not None:
        hooks.on_progress(1.0)
    return TrainResult(
        steps=trainer.state.global_step,
        final_loss=callback.last_loss,
        tokens_per_second=callback.tokens_per_second(trainer.state),
        seconds=time.monotonic() - started,
        out_dir=out_dir,
    )


def _trainer_args(config: TrainConfig, output_dir: Path) -> dict[str, Any]:
    on_gpu = torch.cuda.is_available()
    return {
        "output_dir": str(output_dir),
        "max_steps": config.max_steps,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "learning_rate": config.learning_rate,
        "lr_scheduler_type": config.lr_scheduler_type,
        "warmup_steps": config.warmup_steps,
        "weight_decay": config.weight_decay,
        "max_grad_norm": config.max_grad_norm,
        "max_length": config.max_length,
        "seed": config.seed,
        "data_seed": config.seed,
        "logging_steps": config.logging_steps,
        # We save the final model ourselves (merged, safetensors); intermediate Trainer checkpoints
        # would contain pickled optimizer state.
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "use_cpu": not on_gpu,
        "bf16": on_gpu and torch.cuda.is_bf16_supported(),
        # TRL turns (gradient a.k.a.) activation checkpointing on by default; it trades compute for
        # memory the small models here do not need, and breaks CPU training.
        "activation_checkpointing": False,
        "dataloader_num_workers": 0,
        "include_num_input_tokens_seen": "non_padding",
    }


def train(
    config: TrainConfig,
    *,
    base_dir: Path,
    data_files: list[Path],
    out_dir: Path,
    hooks: TrainHooks | None = None,
) -> TrainResult:
    """Post-train the checkpoint in `base_dir` on `data_files` and write a full model to `out_dir`.

    `out_dir` must not exist yet (or be empty); it appears only when training completes, so a
    crashed or cancelled job never leaves a half-written checkpoint. LoRA adapters are merged
    before saving: every checkpoint is a plain full model. Raises `Cancelled` on cooperative
    cancel and ValueError for unusable data or settings.
    """
    hooks = hooks or TrainHooks()
    refuse_non_empty(out_dir)
    torch.set_num_threads(config.num_threads)

    model, tokenizer = load_checkpoint(base_dir)
    rows = _read_jsonl(data_files)
    _check_rows(rows, config.recipe)
    if config.chat_template == "apply":
        if not tokenizer.chat_template:
            raise ValueError("chat_template='apply' but the base checkpoint has no chat template")
        rows = _to_conversational(rows, config.recipe)
    if config.eos_handling == "none":
        if config.chat_template == "apply":
            rows = [
                {
                    "prompt": tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False),
                    "completion": " " + r["completion"][0]["content"],
                }
                for r in rows
            ]
        train_rows: list[dict[str, Any]] = _pretokenize_without_eos(
            rows, tokenizer, config.max_length, add_special_tokens=config.chat_template == "keep"
        )
    else:
        # Not pre-tokenized on purpose: TRL then appends EOS to every completion.
        train_rows = rows
    dataset = datasets.Dataset.from_list(train_rows)

    peft_config = None
    if config.adapter == "lora":
        peft_config = LoraConfig(
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )

    callback = _HooksCallback(hooks)
    started = time.monotonic()
    with staging_dir(out_dir) as staging:
        args = _trainer_args(config, staging / "trainer")
        trainer: SFTTrainer | DPOTrainer
        if config.recipe == "sft":
            trainer = SFTTrainer(
                model=model,
                args=SFTConfig(**args),
                train_dataset=dataset,
                processing_class=tokenizer,
                peft_config=peft_config,
                callbacks=[callback],
            )
        else:
            # The frozen reference is loaded here, through the same safetensors-only path, rather
            # than by TRL from the config's model id. With LoRA, the base with adapters off is it.
            ref_model = None if peft_config is not None else load_checkpoint(base_dir)[0]
            trainer = DPOTrainer(
                model=model,
                ref_model=ref_model,
                args=DPOConfig(**args, beta=config.dpo_beta),
                train_dataset=dataset,
                processing_class=tokenizer,
                peft_config=peft_config,
                callbacks=[callback],
            )
        run_trainer(trainer, callback, "training")
        model_dir = staging / "model"
        sharded = trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled
        if sharded:
            # FSDP / ZeRO-3 (apps.ml.launch, full models only): every rank gathers, the main writes.
            trainer.save_model(str(model_dir))
        if not trainer.is_world_process_zero():
            # One of several ranks (apps.ml.launch): the main process alone writes the checkpoint.
            return TrainResult(trainer.state.global_step, callback.last_loss, 0.0, time.monotonic() - started, out_dir)
        trained: Any = trainer.model
        if config.adapter == "lora":
            trained = trained.merge_and_unload()
        if not sharded:
            trained.save_pretrained(model_dir)  # safetensors is the only format transformers 5 writes
        return publish_checkpoint(
            model_dir,
            base_dir=base_dir,
            out_dir=out_dir,
            trainer=trainer,
            callback=callback,
            hooks=hooks,
            started=started,
        )
