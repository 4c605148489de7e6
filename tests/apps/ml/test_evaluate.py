"""Evaluation runner: batching is invisible, and the vLLM backend matches the HF one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.ml.checkpoints import load_checkpoint
from apps.ml.context import model_context
from apps.ml.inference import evaluate, generate_texts
from apps.ml.vllm_client import VLLMError
from tests.fakes.openai_completions import serve
from tests.support.context import samples_of_lengths


@pytest.fixture(scope="module")
def reference(minibench: Path) -> Path:
    return minibench / "references" / "arithmetic"


def test_batched_and_one_by_one_outputs_are_identical(
    reference: Path, arithmetic_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    samples = feedback_samples[:48]
    batched = evaluate(checkpoint_dir=reference, samples=samples, task=arithmetic_task, batch_size=16)
    single = evaluate(checkpoint_dir=reference, samples=samples, task=arithmetic_task, batch_size=1)
    assert batched == single
    assert [r["id"] for r in batched] == [s["id"] for s in samples]
    # The reference answers with a bare number and stops: outputs are short and mostly right.
    assert all(len(r["output"]) <= 5 for r in batched)
    assert sum(r["correct"] for r in batched) > len(samples) // 2


def test_vllm_backend_matches_hf_backend(
    reference: Path, arithmetic_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    samples = feedback_samples[:20]
    model, tokenizer = load_checkpoint(reference)

    def generate(prompts: list[str], max_tokens: int, stop: list[str], add_special_tokens: bool) -> list[str]:
        return generate_texts(
            model, tokenizer, prompts, max_new_tokens=max_tokens, stop=stop, add_special_tokens=add_special_tokens
        )

    hf = evaluate(checkpoint_dir=reference, samples=samples, task=arithmetic_task)
    with serve(model_id="minibench-ref", root=str(reference), generate=generate) as server:
        via_vllm = evaluate(
            checkpoint_dir=reference,
            samples=samples,
            task=arithmetic_task,
            backend="vllm",
            vllm_url=server.url,
            batch_size=8,
        )
    assert via_vllm == hf
    assert len(server.requests) == 3  # 20 prompts in batches of 8
    request = server.requests[0]
    assert request["model"] == "minibench-ref"
    assert request["temperature"] == 0.0
    assert request["max_tokens"] == arithmetic_task["decoding"]["max_new_tokens"]
    assert request["stop"] == arithmetic_task["stop"]
    assert request["add_special_tokens"] is True  # a plain (not chat-rendered) prompt gets BOS
    assert request["prompt"][0] == arithmetic_task["prompt_template"].replace("{question}", samples[0]["prompt"])


def test_vllm_backend_refuses_a_server_with_other_weights(
    reference: Path, minibench: Path, arithmetic_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    with (
        serve(model_id="theta0", root=str(minibench / "theta0"), generate=lambda p, m, s, a: [""] * len(p)) as server,
        pytest.raises(VLLMError, match="not the checkpoint under evaluation"),
    ):
        evaluate(
            checkpoint_dir=reference,
            samples=feedback_samples[:2],
            task=arithmetic_task,
            backend="vllm",
            vllm_url=server.url,
        )


def test_the_registered_models_eos_ids_and_stop_tokens_end_generations(
    reference: Path, arithmetic_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    """A family's end-of-turn token (Qwen3's <|im_end|>) is not its tokenizer's EOS: the registered
    profile's ids must end a generation too, on every engine, or answers run on to max tokens."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    samples = feedback_samples[:8]
    plain = evaluate(checkpoint_dir=reference, samples=samples, task=arithmetic_task)
    assert all(r["output"] for r in plain)
    tokenizer = AutoTokenizer.from_pretrained(reference, local_files_only=True)
    first = [tokenizer(r["output"], add_special_tokens=False)["input_ids"][0] for r in plain]
    # Every answer opens with the same token here (a leading space): as an EOS id it ends each at once.
    assert len(set(first)) == 1
    profile = {"eos_token_ids": [first[0]]}
    assert [r["output"] for r in evaluate(checkpoint_dir=reference, samples=samples, task=arithmetic_task,
                                          model_profile=profile)] == [""] * len(samples)  # fmt: skip
    # An end-of-turn string of the family cuts each answer before its first occurrence.
    last = plain[0]["output"][-1]
    cut = evaluate(checkpoint_dir=reference, samples=samples, task=arithmetic_task,
                   model_profile={"stop_tokens": [last]})  # fmt: skip
    assert [r["output"] for r in cut] == [r["output"].split(last)[0] for r in plain]


def test_engines_agree_at_the_context_limit(
    reference: Path, arithmetic_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    """One rule (apps.ml.context) before either engine sees a prompt: prompt + new tokens never exceed
    the context, the prompt is never cut, a prompt with no room is not generated; HF and a server with
    vLLM's length check (400 past max_model_len) score every sample the same, with no retry."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    context = model_context(reference)
    assert context == 512  # the tiny model's max_position_embeddings
    max_tokens = 24
    task = {**arithmetic_task, "decoding": {**arithmetic_task.get("decoding", {}), "max_new_tokens": max_tokens}}
    tokenizer = AutoTokenizer.from_pretrained(reference, local_files_only=True)
    lengths = [context - max_tokens - 3, context - 5, context - 1, context, context + 7]
    samples = samples_of_lengths(tokenizer, task, feedback_samples[0], lengths)

    hf = evaluate(checkpoint_dir=reference, samples=samples, task=task, batch_size=8)

    fits = {row["id"]: (row.get("prompt_tokens"), row.get("max_tokens"), row.get("over_context")) for row in hf}
    assert list(fits.values()) == [(None, None, None), (context - 5, 5, None), (context - 1, 1, None),
                                   (context, None, True), (context + 7, None, True)]  # fmt: skip
    for row, length in zip(hf, lengths, strict=True):
        generated = len(tokenizer(row["output"], add_special_tokens=False)["input_ids"])
        assert length + generated <= context or row["output"] == ""
    assert [r["output"] for r in hf[3:]] == ["", ""]
    assert all(r["retries"] == 0 for r in hf)

    model, hf_tokenizer = load_checkpoint(reference)

    def generate(prompts: list[str], limit: int, stop: list[str], add_special_tokens: bool) -> list[str]:
        return generate_texts(
            model, hf_tokenizer, prompts, max_new_tokens=limit, stop=stop, add_special_tokens=add_special_tokens
        )

    def count(prompt: str, specials: bool) -> int:
        return len(hf_tokenizer(prompt, add_special_tokens=specials)["input_ids"])

    with serve(model_id="ref", root=str(reference), generate=generate, max_model_len=context, count=count) as server:
        via_vllm = evaluate(checkpoint_dir=reference, samples=samples, task=task, backend="vllm",
                            vllm_url=server.url, batch_size=8)  # fmt: skip
    assert via_vllm == hf
    # Every request fitted (none refused and retried): the over-context prompts never reached the server.
    asked = [(p, r["max_tokens"]) for r in server.requests if "prompt" in r for p in r["prompt"]]
    assert sorted(limit for _, limit in asked) == [1, 5, max_tokens]
    assert all(count(p, True) + limit <= context for p, limit in asked)
