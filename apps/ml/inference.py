"""Sealed evaluation: render the task's prompts, decode greedily (HF or vLLM), score each output."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from apps.benchmarks.evaluators import score
from apps.ml.checkpoints import device, load_checkpoint
from apps.ml.vllm_client import complete as vllm_complete


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


def _decoding_kwargs(sampling: Mapping[str, Any] | None) -> dict[str, Any]:
    if sampling is None:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": float(sampling.get("temperature", 1.0)),
        "top_p": float(sampling.get("top_p", 1.0)),
        "top_k": 0,  # no top-k cut: the task says temperature and top_p only
    }


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
    sampling: Mapping[str, Any] | None = None,
) -> list[str]:
    """Greedy continuations of `prompts`, cut at EOS and at the first stop string.

    `sampling` (``temperature``, ``top_p``) decodes by sampling instead, for the task-environment
    reliability filter, which repeats a task under its own decoding; seed torch before calling.
    Sealed evaluation never passes it.

    Batches are left-padded so every prompt ends where generation starts; the attention mask and
    the position ids derived from it make padding invisible to the model.
    """
    tokenizer.padding_side = "left"
    target = device()
    model.to(target)  # type: ignore[arg-type]  # transformers' stub wraps .to() oddly
    model.train(False)  # eval mode; .eval() is untyped in the stubs
    outputs: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = list(prompts[start : start + batch_size])
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens).to(target)
        generated: torch.Tensor = model.generate(  # type: ignore[operator]
            **enc,
            max_new_tokens=max_new_tokens,
            **_decoding_kwargs(sampling),
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
