"""Sealed samples whose rendered prompts are an exact number of tokens: at and past a model's context.

Shared by the HF tests (tests/apps/ml/test_evaluate.py) and the vLLM suite (tests/vllm): the same
samples through both engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apps.ml.inference import prompt_counter, render_prompt, uses_special_tokens

FILLERS = ("7 ", "+ ", "1", " ")


def samples_of_lengths(
    tokenizer: Any, task: dict[str, Any], sample: dict[str, Any], lengths: Sequence[int]
) -> list[dict[str, Any]]:
    """Copies of ``sample`` whose prompts, rendered as the task renders them, are ``lengths`` tokens long.

    The question is prefixed with filler text, grown until each wanted length is met exactly.
    """
    count = prompt_counter(tokenizer, add_special_tokens=uses_special_tokens(task))
    question = str(sample["prompt"])
    found: dict[int, str] = {}
    for filler in FILLERS:
        for extra in ("", *FILLERS):
            for n in range(max(lengths) + 2):
                text = filler * n + extra + question
                tokens = count(render_prompt(task, text, tokenizer))
                found.setdefault(tokens, text)
                if tokens > max(lengths):
                    break
            if all(length in found for length in lengths):
                return [{**sample, "id": f"{sample['id']}-len{length}", "prompt": found[length]} for length in lengths]
    missing = [length for length in lengths if length not in found]
    raise AssertionError(f"no filler gives prompts of {missing} tokens")
