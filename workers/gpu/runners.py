"""Training and evaluation runners: the only code that touches model weights.

Pure ML, no Django: the Celery tasks in `workers.gpu.tasks` fetch the job row, call one of these
functions and write the result back. Everything here runs the same on a 2-core laptop (HF on CPU)
and on a GPU host (vLLM behind its OpenAI-compatible API for evaluation).

Safety rules kept here rather than at each call site: weights load and save as safetensors only
(never pickle), no `trust_remote_code`, and no network access to the Hub.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# The runners must never reach the Hub: every model, tokenizer and dataset is a local path. Loads
# below also pass local_files_only=True; these cover whatever TRL or datasets import later.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging  # noqa: E402

from apps.benchmarks.evaluators import score  # noqa: E402
from workers.gpu.hparams import TrainConfig  # noqa: E402
from workers.gpu.vllm_client import complete as vllm_complete  # noqa: E402

# Workers report progress through hooks; per-load progress bars would only clutter job logs.
hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

# Files that define the tokenizer; copied verbatim from the base so that training never changes
# the vocabulary, special tokens or chat template (which the integrity checks compare).
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


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


# --- small shared helpers ----------------------------------------------------------------------


def manifest(dir: Path) -> dict[str, str]:
    """sha256 of every file under `dir`, keyed by POSIX path relative to `dir`."""
    result: dict[str, str] = {}
    for path in sorted(p for p in dir.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        result[path.relative_to(dir).as_posix()] = digest.hexdigest()
    return result


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_checkpoint(checkpoint_dir: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local HF checkpoint; refuses pickle weights and remote code."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir, trust_remote_code=False, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        checkpoint_dir,
        dtype=torch.float32,
        use_safetensors=True,
        trust_remote_code=False,
        local_files_only=True,
    )
    return model, tokenizer


def _read_jsonl(paths: Sequence[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path.name}:{lineno}: not valid JSON ({exc.msg})") from None
    if not rows:
        raise ValueError("the training data is empty")
    return rows


# --- training ----------------------------------------------------------------------------------

_FORMAT_KEYS = {"sft": ("prompt", "completion"), "dpo": ("prompt", "chosen", "rejected")}


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
    # Imported here: TRL and PEFT are heavy, and evaluation-only workers never need them.
    import datasets
    from peft import LoraConfig
    from transformers.trainer_callback import PrinterCallback
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer  # type: ignore[attr-defined]

    hooks = hooks or TrainHooks()
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"output directory {out_dir} is not empty")
    torch.set_num_threads(config.num_threads)
    datasets.disable_progress_bar()

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

    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    callback = _HooksCallback(hooks)
    started = time.monotonic()
    try:
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
        trainer.remove_callback(PrinterCallback)  # progress goes through hooks, not stdout
        trainer.train()
        if callback.cancelled:
            raise Cancelled(f"training cancelled at step {trainer.state.global_step}")
        trained: Any = trainer.model
        if config.adapter == "lora":
            trained = trained.merge_and_unload()
        model_dir = staging / "model"
        trained.save_pretrained(model_dir)  # safetensors is the only format transformers 5 writes
        for name in _TOKENIZER_FILES:
            if (base_dir / name).is_file():
                shutil.copy2(base_dir / name, model_dir / name)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        if out_dir.exists():
            out_dir.rmdir()  # checked empty above
        # Same filesystem, so the checkpoint appears atomically and complete.
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
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# --- evaluation --------------------------------------------------------------------------------


def uses_special_tokens(task: dict[str, Any]) -> bool:
    """Whether prompts are tokenized with the tokenizer's specials (BOS).

    A chat-rendered prompt already is the full model input: HF's `apply_chat_template`, TRL's
    conversational path and vLLM's chat endpoint all tokenize it without adding specials, and so
    must we, or training and evaluation would disagree by one BOS token.
    """
    return not task.get("use_chat_template")


def render_prompt(task: dict[str, Any], question: str, tokenizer: PreTrainedTokenizerBase | None) -> str:
    """The exact text the model is given for one sealed question under the task's settings."""
    text = str(task["prompt_template"]).replace("{question}", question)
    if task.get("use_chat_template"):
        if tokenizer is None or not tokenizer.chat_template:
            raise ValueError(f"task {task.get('name')!r} uses the chat template but the tokenizer has none")
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        text = str(rendered)
    return text


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
    """Cut `text` at the earliest occurrence of any stop string (the stop string is dropped)."""
    cut = len(text)
    for s in stop:
        if s:
            idx = text.find(s)
            if idx != -1:
                cut = min(cut, idx)
    return text[:cut]


@torch.inference_mode()
def generate_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    batch_size: int = 32,
    add_special_tokens: bool = True,
) -> list[str]:
    """Greedy continuations of `prompts`, cut at EOS and at the first stop string.

    Batches are left-padded so every prompt ends where generation starts; the attention mask and
    the position ids derived from it make padding invisible to the model.
    """
    tokenizer.padding_side = "left"
    device = _device()
    model.to(device)  # type: ignore[arg-type]  # transformers' stub wraps .to() oddly
    model.train(False)  # eval mode; .eval() is untyped in the stubs
    outputs: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = list(prompts[start : start + batch_size])
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens).to(device)
        generated: torch.Tensor = model.generate(  # type: ignore[operator]
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            # Stop strings end a sequence early (the batch ends when all have); the text is cut
            # again below, so results do not depend on how generation stopped.
            stop_strings=[s for s in stop if s] or None,
            tokenizer=tokenizer,
        )
        for row in generated[:, enc["input_ids"].shape[1] :].tolist():
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id)]
            text = str(tokenizer.decode(row, skip_special_tokens=True))
            outputs.append(truncate_at_stop(text, stop))
    return outputs


def evaluate(
    *,
    checkpoint_dir: Path,
    samples: list[dict[str, Any]],
    task: dict[str, Any],
    batch_size: int = 32,
    backend: Literal["hf", "vllm"] = "hf",
    vllm_url: str | None = None,
    scorer: Callable[[str, str], bool] | None = None,
) -> list[dict[str, Any]]:
    """Run the sealed samples through the checkpoint with the task's fixed inference settings.

    `samples` are rows `{"id", "prompt", "answer"}`; `task` is the task.json dict. Returns one
    `{"id", "output", "correct"}` per sample, in order. Both backends render the same prompts and
    apply the same decoding and stop strings, so their results are interchangeable. `scorer`
    (output, answer) -> correct is the benchmark's sealed evaluator when the caller has one (the
    evaluation job always does); without it the task's evaluator is looked up by name.
    """
    decoding = task.get("decoding", {})
    if decoding.get("do_sample"):
        raise ValueError("sealed evaluation decodes greedily; task has do_sample=true")
    max_new_tokens = int(decoding.get("max_new_tokens", 32))
    stop = list(task.get("stop", []))

    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir, trust_remote_code=False, local_files_only=True)
    prompts = [render_prompt(task, str(s["prompt"]), tokenizer) for s in samples]
    if backend == "hf":
        model, _ = load_checkpoint(checkpoint_dir)
        outputs = generate_texts(
            model,
            tokenizer,
            prompts,
            max_new_tokens=max_new_tokens,
            stop=stop,
            batch_size=batch_size,
            add_special_tokens=uses_special_tokens(task),
        )
    elif backend == "vllm":
        if not vllm_url:
            raise ValueError("backend='vllm' needs vllm_url (the base URL of a `vllm serve` process)")
        raw = vllm_complete(
            vllm_url,
            model=str(checkpoint_dir),
            prompts=prompts,
            max_tokens=max_new_tokens,
            stop=stop,
            batch_size=batch_size,
            add_special_tokens=uses_special_tokens(task),
        )
        outputs = [truncate_at_stop(text, stop) for text in raw]
    else:
        raise ValueError(f"unknown backend {backend!r}; use 'hf' or 'vllm'")

    if scorer is None:
        evaluator = str(task["evaluator"])

        def scorer(output: str, answer: str) -> bool:
            return score(evaluator, output, answer)

    return [
        {"id": s["id"], "output": out, "correct": bool(scorer(out, str(s["answer"])))}
        for s, out in zip(samples, outputs, strict=True)
    ]
