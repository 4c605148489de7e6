"""One rule at the model's context limit, applied before any engine sees a prompt.

Near the context limit the engines disagreed: vLLM refuses a request whose prompt + max_tokens
exceed its ``max_model_len`` (and the retry cascade then asked again with fewer tokens), while HF
``generate`` ran past the model's positions, so the same sample could be scored differently by
engine. Now every evaluation path (apps.ml.inference.evaluate, the Inspect endpoint's engines in
apps.benchmarks.adapters) counts each rendered prompt's tokens with the checkpoint's tokenizer and
applies **cap-max-tokens** before calling HF or vLLM:

- a sample may generate ``min(max_tokens, context − prompt tokens)`` new tokens, so prompt tokens +
  new tokens never exceed the context; the prompt itself is never cut;
- a prompt that leaves no room for one new token is not generated at all: its output is empty
  (scored as the evaluator scores an empty answer) and its row says ``over_context``.

The context is the checkpoint's ``config.json`` (:func:`model_context`), the number vLLM derives
its ``max_model_len`` from; a managed ``vllm serve`` is started with exactly this number
(``--max-model-len``), so both engines work under one limit. The benchmark's contract states the
rule (``contract["context"]``) and each evaluation records it with the context it used.

Django-free and torch-free: the callers pass token counts or a counting function.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTEXT_RULE = "cap-max-tokens"
# What the benchmark contract records (apps.benchmarks.contract).
CONTEXT_CONTRACT: dict[str, str] = {
    "rule": CONTEXT_RULE,
    "statement": (
        "applied before either engine (HF generate, vLLM) sees the prompt: a sample generates at most "
        "min(max_tokens, context - prompt tokens) new tokens, the prompt is never cut, and a prompt that leaves "
        "no room for one new token is not generated (empty output, marked over_context); the context is the "
        "checkpoint config's, and a managed vLLM server is started with it as --max-model-len"
    ),
}
# config.json keys that bound the positions a model takes, as vLLM reads them (the smallest wins).
_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def model_context(checkpoint_dir: Path) -> int | None:
    """The context length of the checkpoint in ``checkpoint_dir`` (None when its config states none)."""
    path = Path(checkpoint_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(config.get("text_config"), dict):  # multimodal configs nest the language model's
        config = {**config, **config["text_config"]}
    lengths = [
        int(v) for k in _LENGTH_KEYS if isinstance(v := config.get(k), int) and not isinstance(v, bool) and v > 0
    ]
    return min(lengths) if lengths else None


@dataclass(frozen=True)
class ContextFit:
    """What the rule gives one prompt: its token count and the new tokens it may generate (0: none)."""

    prompt_tokens: int
    max_tokens: int

    @property
    def over_context(self) -> bool:
        return self.max_tokens < 1


def fit(prompt_tokens: int, max_tokens: int, context: int | None) -> ContextFit:
    """The rule for one prompt of ``prompt_tokens`` tokens under ``max_tokens`` and ``context``."""
    if prompt_tokens < 0 or max_tokens < 1:
        raise ValueError(f"prompt tokens must be >= 0 and max_tokens >= 1, got {prompt_tokens} and {max_tokens}")
    if context is None:
        return ContextFit(prompt_tokens, max_tokens)
    return ContextFit(prompt_tokens, max(0, min(max_tokens, context - prompt_tokens)))


# (prompts, max_tokens, seeds or None) -> texts: one engine call (apps.ml.inference.GenerateFn).
Generate = Callable[[list[str], int, "list[int] | None"], list[str]]


def within_context(generate: Generate, fits: Mapping[str, ContextFit]) -> Generate:
    """``generate`` under the rule: each prompt gets ``min(limit, its fit)`` new tokens.

    Prompts are grouped by the limit they get (one engine call per group, in order); a prompt
    over the context is answered with an empty text without calling the engine. ``fits`` maps
    each rendered prompt to its fit (equal prompts have equal fits).
    """

    def run(batch: list[str], limit: int, seeds: list[int] | None) -> list[str]:
        out = [""] * len(batch)
        groups: dict[int, list[int]] = {}
        for index, prompt in enumerate(batch):
            allowed = min(limit, fits[prompt].max_tokens)
            if allowed > 0:
                groups.setdefault(allowed, []).append(index)
        for allowed, indices in sorted(groups.items(), reverse=True):
            texts = generate(
                [batch[i] for i in indices], allowed, None if seeds is None else [seeds[i] for i in indices]
            )
            for index, text in zip(indices, texts, strict=True):
                out[index] = text
        return out

    return run


def fit_prompts(
    prompts: Sequence[str], *, count: Callable[[str], int], max_tokens: int, context: int | None
) -> dict[str, ContextFit]:
    """The fit of every distinct prompt, its tokens counted by ``count`` (the engine's tokenization)."""
    return {prompt: fit(count(prompt), max_tokens, context) for prompt in dict.fromkeys(prompts)}


def row_context(row: dict[str, Any], fitted: ContextFit, max_tokens: int) -> dict[str, Any]:
    """Mark an evaluation row the rule touched: ``max_tokens`` when capped, ``over_context`` when not generated."""
    if fitted.over_context:
        row["over_context"] = True
        row["prompt_tokens"] = fitted.prompt_tokens
    elif fitted.max_tokens < max_tokens:
        row["max_tokens"] = fitted.max_tokens
        row["prompt_tokens"] = fitted.prompt_tokens
    return row
