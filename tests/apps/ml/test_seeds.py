"""Final-evaluation seeds: per-sample seeds are deterministic and distinct, and sampled decoding honours them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from apps.ml.inference import GenerationFailed, evaluate, generate_with_cascade
from apps.ml.seeds import (
    FINAL_SEEDS,
    max_tokens_cascade,
    max_tokens_of,
    run_seeds,
    sample_seed,
    seed_count,
    stop_strings_of,
)
from apps.ml.vllm_client import VLLMError, VLLMRefused

SAMPLED = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8}


def test_sample_seed_is_sha256_of_run_seed_sample_id_epoch_and_call() -> None:
    expected = int.from_bytes(hashlib.sha256(b'[3,"gsm8k-17",0,1]').digest()[:8], "big") >> 1
    assert sample_seed(3, "gsm8k-17", 0, 1) == expected
    assert sample_seed(3, "gsm8k-17", 0, 1) == sample_seed(3, "gsm8k-17", 0, 1)
    base = sample_seed(0, "a", 0, 0)
    # Every field changes the seed, and no field can be shifted into another by concatenation.
    assert len({base, sample_seed(1, "a", 0, 0), sample_seed(0, "b", 0, 0), sample_seed(0, "a", 1, 0)}) == 4
    assert sample_seed(0, "a", 0, 1) != base
    assert sample_seed(1, "23") != sample_seed(12, "3")
    seeds = [sample_seed(0, f"s{i}") for i in range(2000)]
    assert len(set(seeds)) == 2000
    assert all(0 <= s < 2**63 for s in seeds)
    with pytest.raises(TypeError):
        sample_seed(True, "a")  # type: ignore[arg-type]


def test_seed_count_is_one_for_greedy_and_five_by_default_for_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RSI_FINAL_SEEDS", raising=False)
    assert run_seeds({"do_sample": False}) == [0]
    assert run_seeds({"do_sample": True, "temperature": 0.0}) == [0]  # temperature 0 is greedy
    assert run_seeds(SAMPLED) == list(FINAL_SEEDS) == [0, 1, 2, 3, 4]
    assert seed_count(SAMPLED, 3) == 3
    monkeypatch.setenv("RSI_FINAL_SEEDS", "2")
    assert run_seeds(SAMPLED) == [0, 1]
    assert run_seeds({"do_sample": False}) == [0]
    with pytest.raises(ValueError, match="between 1 and 5"):
        seed_count(SAMPLED, 9)


def test_max_tokens_cascade_halves_down_to_a_floor() -> None:
    assert max_tokens_cascade(4000) == [4000, 2000, 1000]
    assert max_tokens_cascade(20) == [20, 16]
    assert max_tokens_cascade(8) == [8]
    with pytest.raises(ValueError, match="positive"):
        max_tokens_cascade(0)


def test_cascade_retries_a_failed_batch_with_fewer_tokens_and_a_new_call_seed() -> None:
    calls: list[tuple[int, list[int] | None]] = []

    def engine(batch: list[str], limit: int, seeds: list[int] | None) -> list[str]:
        # Stands for an engine that refuses prompt + max_tokens over its context (as vLLM answers 400).
        calls.append((limit, seeds))
        if limit > 1000:
            raise VLLMRefused(f"max_tokens {limit} exceeds the context")
        return [f"{p}!" for p in batch]

    texts, steps = generate_with_cascade(
        engine, ["a", "b", "c"], ["1", "2", "3"], max_tokens=4000, batch_size=2, run_seed=7
    )
    assert texts == ["a!", "b!", "c!"]
    assert steps == [2, 2, 2]
    assert [c[0] for c in calls] == [4000, 2000, 1000, 4000, 2000, 1000]
    assert calls[2][1] == [sample_seed(7, "1", 0, 2), sample_seed(7, "2", 0, 2)]
    assert calls[0][1] != calls[2][1]

    def refusing(batch: list[str], limit: int, seeds: list[int] | None) -> list[str]:
        raise VLLMRefused("context exceeded")

    with pytest.raises(GenerationFailed, match="every retry failed"):
        generate_with_cascade(refusing, ["a"], ["1"], max_tokens=64, batch_size=1, run_seed=None)

    def wrong_model(batch: list[str], limit: int, seeds: list[int] | None) -> list[str]:
        raise VLLMError("serves another model")

    with pytest.raises(VLLMError, match="another model"):  # not retried: fewer tokens cannot fix it
        generate_with_cascade(wrong_model, ["a"], ["1"], max_tokens=64, batch_size=1, run_seed=None)


@pytest.fixture(scope="module")
def sampled_task(arithmetic_task: dict[str, Any]) -> dict[str, Any]:
    return {**arithmetic_task, "decoding": {**arithmetic_task.get("decoding", {}), **SAMPLED}}


def test_sampled_outputs_depend_on_each_samples_own_seed_only(
    minibench: Path, sampled_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    theta0 = minibench / "theta0"
    samples = feedback_samples[:12]
    first = evaluate(checkpoint_dir=theta0, samples=samples, task=sampled_task, run_seed=0)
    again = evaluate(
        checkpoint_dir=theta0, samples=list(reversed(samples)), task=sampled_task, run_seed=0, batch_size=5
    )
    other = evaluate(checkpoint_dir=theta0, samples=samples, task=sampled_task, run_seed=1)
    by_id = {r["id"]: r for r in again}
    # Same run seed: the same output per sample, whatever the order and batching.
    assert [r["output"] for r in first] == [by_id[r["id"]]["output"] for r in first]
    assert [r["seed"] for r in first] == [sample_seed(0, str(s["id"])) for s in samples]
    # Not one shared random stream: θ0's samples differ from each other and with the run seed.
    assert len({r["output"] for r in first}) > len(samples) // 2
    assert sum(a["output"] != b["output"] for a, b in zip(first, other, strict=True)) > len(samples) // 2
    assert json.dumps(first)  # rows are JSON (they are recorded as such)


# A benchmark registered with benchmark_add states its decoding as its contract does
# (apps.benchmarks.contract.DECODING_KEYS), not as the minibench's task.json does.
CONTRACT_SAMPLED = {"temperature": 0.8, "top_p": 1.0, "max_tokens": 3, "stop": [], "seed_policy": "per-sample-seeds"}
CONTRACT_GREEDY = {
    "temperature": 0.0,
    "top_p": 1.0,
    "max_tokens": 512,
    "stop": ["\n"],
    "seed_policy": "greedy-single-seed",
}


def test_contract_decoding_is_read_as_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RSI_FINAL_SEEDS", raising=False)
    assert run_seeds(CONTRACT_SAMPLED) == [0, 1, 2, 3, 4]
    assert run_seeds(CONTRACT_GREEDY) == [0]
    # A sampled seed policy at temperature 0 draws nothing at random: one seed.
    assert run_seeds({**CONTRACT_SAMPLED, "temperature": 0.0}) == [0]
    assert max_tokens_of(CONTRACT_GREEDY) == 512
    assert max_tokens_of({"max_new_tokens": 7}) == 7
    assert stop_strings_of({"decoding": CONTRACT_GREEDY, "stop": ["ignored"]}) == ["\n"]
    assert stop_strings_of({"decoding": {"max_new_tokens": 7}, "stop": ["Q:"]}) == ["Q:"]


def test_evaluate_decodes_a_contract_as_stated(
    minibench: Path, arithmetic_task: dict[str, Any], feedback_samples: list[dict[str, Any]]
) -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415

    theta0 = minibench / "theta0"
    samples = feedback_samples[:6]
    task = {k: v for k, v in arithmetic_task.items() if k != "stop"} | {"decoding": CONTRACT_SAMPLED}
    rows = evaluate(checkpoint_dir=theta0, samples=samples, task=task, run_seed=0)
    # Sampled under each sample's own seed, as the contract's seed policy says ...
    assert [r["seed"] for r in rows] == [sample_seed(0, str(s["id"])) for s in samples]
    # ... and never past the contract's max_tokens (read as 32 tokens when only max_new_tokens counted).
    tokenizer = AutoTokenizer.from_pretrained(theta0, local_files_only=True)
    lengths = [len(tokenizer(r["output"], add_special_tokens=False)["input_ids"]) for r in rows]
    assert max(lengths) <= 3, lengths
    longer = evaluate(
        checkpoint_dir=theta0, samples=samples, task={**task, "decoding": {**CONTRACT_SAMPLED, "max_tokens": 24}}
    )
    assert max(len(tokenizer(r["output"], add_special_tokens=False)["input_ids"]) for r in longer) > 3
