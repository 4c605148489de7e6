"""The evaluation endpoint's seeds and retries: per-sample seeds by sealed id, and the retry cascade.

The engine is the real one (HF generate on the minibench θ0, apps.benchmarks.adapters.hf_generate),
wrapped only to record what the endpoint asked of it; requests are real HTTP in Inspect's shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from apps.benchmarks.adapters import hf_generate
from apps.benchmarks.endpoint import sample_key, serve
from apps.ml.inference import GENERATION_FAILURES
from apps.ml.seeds import sample_seed
from apps.ml.vllm_client import VLLMRefused

SAMPLED = {"temperature": 0.9, "top_p": 1.0, "max_tokens": 64, "stop": [], "seed_policy": "per-sample-seeds"}
SAMPLES = [
    {"id": "q-1", "prompt": "What is 12 + 30?"},
    {"id": "q-2", "prompt": "What is 7 + 5?"},
    {"id": "q-3", "prompt": "What is 7 + 55?"},  # holds q-2's prompt: the longer one wins
]


def ask(base_url: str, question: str, *, max_tokens: int = 64) -> requests.Response:
    body = {
        "model": "theta0", "temperature": 0.9, "top_p": 1.0, "max_tokens": max_tokens, "seed": 42,  # Inspect's one seed
        "messages": [{"role": "system", "content": "Answer."}, {"role": "user", "content": f"Q: {question}\nA:"}],
    }  # fmt: skip
    return requests.post(f"{base_url}/chat/completions", json=body, timeout=120)


@pytest.fixture(scope="module")
def engine(built_minibench: Path):
    manifest = json.loads((built_minibench / "manifest.json").read_text())
    generate, _ = hf_generate(built_minibench / manifest["theta0"], SAMPLED)
    return generate


def test_sample_key_names_the_sealed_sample_the_request_holds():
    user = [{"role": "user", "content": "Q: What is 7 + 55?\nA:"}]
    assert sample_key(user, SAMPLES) == ("q-3", True)
    assert sample_key([{"role": "user", "content": "What is 7 + 5? Think."}], SAMPLES) == ("q-2", True)
    key, matched = sample_key([{"role": "user", "content": "unrelated"}], SAMPLES)
    assert (key.startswith("prompt-sha256:"), matched) == (True, False)
    twins = [{"id": "a", "prompt": "same"}, {"id": "b", "prompt": "same"}]
    assert sample_key([{"role": "user", "content": "same"}], twins)[1] is False  # ambiguous: never a guess


def test_each_request_is_sampled_under_its_own_samples_seed_not_the_request_seed(engine):
    seen: list[int | None] = []

    def recording(prompt, max_tokens, stop, seed):
        seen.append(seed)
        return engine(prompt, max_tokens, stop, seed)

    def run(run_seed: int) -> tuple[list[str], list[dict]]:
        with serve(
            model="theta0", decoding=SAMPLED, generate=recording, samples=SAMPLES, run_seed=run_seed,
            failures=GENERATION_FAILURES,
        ) as served:  # fmt: skip
            texts = []
            for question in ("What is 12 + 30?", "What is 7 + 55?", "What is 12 + 30?"):
                answer = ask(served["base_url"], question)
                assert answer.status_code == 200, answer.text
                texts.append(answer.json()["choices"][0]["message"]["content"])
            return texts, list(served["requests"])

    texts, log = run(7)
    assert [r["sample"] for r in log] == ["q-1", "q-3", "q-1"]
    # sha256(run seed, sample id, epoch, call): q-1's second request is its call 1.
    expected = [sample_seed(7, "q-1", 0, 0), sample_seed(7, "q-3", 0, 0), sample_seed(7, "q-1", 0, 1)]
    assert [r["seed"] for r in log] == expected == seen
    assert 42 not in seen
    again, _ = run(7)
    assert again == texts  # reproducible from the record alone
    _, other = run(8)
    assert [r["seed"] for r in other] == [
        sample_seed(8, "q-1", 0, 0),
        sample_seed(8, "q-3", 0, 0),
        sample_seed(8, "q-1", 0, 1),
    ]


def test_a_refused_generation_is_retried_with_fewer_tokens_and_a_fresh_call_seed(engine):
    limits: list[int] = []

    def small_context(prompt, max_tokens, stop, seed):
        # An engine whose context takes prompt + 20 tokens at most refuses more, as vLLM answers 400.
        limits.append(max_tokens)
        if max_tokens > 20:
            raise VLLMRefused(f"max_tokens {max_tokens} exceeds the context")
        return engine(prompt, max_tokens, stop, seed)

    with serve(
        model="theta0", decoding=SAMPLED, generate=small_context, samples=SAMPLES, run_seed=3,
        failures=GENERATION_FAILURES,
    ) as served:  # fmt: skip
        answer = ask(served["base_url"], "What is 7 + 5?")
        assert answer.status_code == 200, answer.text
        (record,) = served["requests"]
    assert limits == [64, 32, 16]
    assert (record["sample"], record["retries"], record["call"]) == ("q-2", 2, 2)
    assert record["seed"] == sample_seed(3, "q-2", 0, 2)

    def no_context(prompt, max_tokens, stop, seed):
        raise VLLMRefused("context exceeded")

    with serve(
        model="theta0", decoding=SAMPLED, generate=no_context, samples=SAMPLES, failures=GENERATION_FAILURES
    ) as served:
        answer = ask(served["base_url"], "What is 7 + 5?")
        (record,) = served["requests"]
    assert answer.status_code == 500
    assert "every retry failed" in answer.json()["error"]["message"]
    assert record["failed"].count("context exceeded") == 3
