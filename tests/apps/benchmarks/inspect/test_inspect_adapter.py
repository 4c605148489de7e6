"""The Inspect adapter, offline: GSM8K, HumanEval and BFCL-format files written here, the minibench θ0.

The tiny model scores 0 on these formats, exactly as a broken pipeline would; so the records are
asserted for what they must be (the sealed ids in order, the model's own completions, our
scorer's verdict on each), and planted correct outputs go through the same sealed scorers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.benchmarks.adapters import HarnessRefused, inspect_evaluate, inspect_evaluate_seeds
from apps.benchmarks.adding import benchmark_add
from apps.benchmarks.services import SealBroken, benchmark_load_sealed, benchmark_scorer
from apps.ml import evaluators
from apps.ml.seeds import sample_seed
from apps.ml.vllm_client import VLLMRefused
from tests.apps.benchmarks.inspect.conftest import GREEDY, SAMPLED

pytestmark = pytest.mark.django_db
DECODING = GREEDY


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def gsm8k(prefix: str) -> list[dict]:
    return [
        {"id": f"{prefix}-{i}", "question": f"Tom has {i} pens and buys {i + 2} more. How many pens?",
         "answer": f"{i} + {i + 2} = <<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2}\n#### {2 * i + 2}"}
        for i in range(10)
    ]  # fmt: skip


def humaneval(prefix: str) -> list[dict]:
    return [
        {"task_id": f"{prefix}/{i}", "prompt": f'def add_{i}(x: int) -> int:\n    """Return x + {i}."""\n',
         "canonical_solution": f"    return x + {i}\n", "entry_point": f"add_{i}",
         "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n    assert candidate(-{i}) == 0\n"}
        for i in range(10)
    ]  # fmt: skip


def bfcl(prefix: str) -> list[dict]:
    cities = ["Paris", "Lima", "Oslo", "Rome", "Kyiv", "Cairo", "Quito", "Hanoi", "Dakar", "Perth"]
    return [
        {"id": f"{prefix}_{i}", "question": [[{"role": "user", "content": f"What is the weather in {city}?"}]],
         "function": [{"name": "get_weather", "parameters": {"type": "dict", "properties": {"city": {}}}}],
         "ground_truth": {"name": "get_weather", "arguments": {"city": city}}}
        for i, city in enumerate(cities)
    ]  # fmt: skip


# A task module in the BFCL format (inspect_evals' bfcl git-downloads its data at construction,
# so the sealed-module route is how BFCL-format files run here).
BFCL_TASK = """
import json
from inspect_ai import Task, task
from inspect_ai.dataset import Sample, json_dataset
from inspect_ai.solver import generate


def record_to_sample(record):
    question = record["question"][0][-1]["content"]
    tools = json.dumps(record["function"])
    prompt = f"Tools: {tools}\\nCall one tool as JSON.\\n{question}"
    return Sample(input=prompt, target=json.dumps(record["ground_truth"]))


@task
def bfcl_simple():
    return Task(dataset=json_dataset("bfcl.jsonl", record_to_sample), solver=generate())
"""


def run_final(benchmark, theta0, tmp_path):
    samples, _ = benchmark_load_sealed(benchmark=benchmark, split="final")
    theta0["calls"].clear()
    rows = inspect_evaluate(
        contract=benchmark.contract, sealed_path=Path(benchmark.sealed_path), samples=samples, model_id="theta0",
        generate=theta0["generate"], chat_template=theta0["chat_template"],
        scorer=benchmark_scorer(benchmark=benchmark),
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    return samples, rows


def assert_records(samples, rows, theta0, evaluator, needle=lambda sample: sample["prompt"][:40]):
    assert [r["id"] for r in rows] == [s["id"] for s in samples]
    # Every output is a completion our engine produced (one call per sample; Inspect may trim
    # trailing whitespace off a completion), for a prompt that holds that sample's question.
    assert len(theta0["calls"]) == len(samples)
    completions = {text.rstrip() for _, text in theta0["calls"]}
    assert [r["output"] for r in rows if r["output"].rstrip() not in completions] == [], sorted(completions)
    prompts = [prompt for prompt, _ in theta0["calls"]]
    for sample, row in zip(samples, rows, strict=True):
        assert any(needle(sample) in prompt for prompt in prompts), needle(sample)
        assert row["correct"] == evaluators.score(evaluator, row["output"], sample["answer"])


def test_gsm8k_through_inspect_evals_on_sealed_rows(sealed_root, inspect_env, theta0, tmp_path):
    benchmark = benchmark_add(
        name="gsm8k/inspect", feedback_file=write(tmp_path / "fb.jsonl", gsm8k("fb")),
        final_file=write(tmp_path / "fin.jsonl", gsm8k("fin")), evaluator="gsm8k_numeric", decoding=DECODING,
        prompt_field="question", inspect_task="inspect_evals/gsm8k", inspect_task_args={"fewshot": 0},
    )  # fmt: skip
    packages = benchmark.contract["packages"]
    assert packages["versions"] == {"inspect-ai": "0.3.285", "inspect-evals": "0.26.0"}
    assert len(packages["task_source_sha256"]) == 64
    assert len(packages["requirements_sha256"]) == 64
    samples, rows = run_final(benchmark, theta0, tmp_path)
    assert_records(samples, rows, theta0, "gsm8k_numeric")
    # inspect_evals' own prompt wrapped the sealed question (the task's solver ran), and its
    # scorer ran beside ours: "C"/"I" per sample, agreeing with ours on these outputs.
    assert all("ANSWER: $ANSWER" in prompt for prompt, _ in theta0["calls"])
    assert all(r["inspect_score"] in ("C", "I") for r in rows)
    # Planted outputs through the same sealed scorer.
    score = benchmark_scorer(benchmark=benchmark)
    assert score("Reasoning...\nANSWER: 2", samples[0]["answer"])
    assert not score("ANSWER: -2", samples[0]["answer"])


def test_humaneval_through_inspect_evals_scored_in_our_sandbox(sealed_root, inspect_env, theta0, tmp_path):
    benchmark = benchmark_add(
        name="humaneval/inspect", feedback_file=write(tmp_path / "fb.jsonl", humaneval("Fb")),
        final_file=write(tmp_path / "fin.jsonl", humaneval("Fin")), evaluator="code_tests", decoding=DECODING,
        id_field="task_id", prompt_field="prompt", answer_fields=["prompt", "test", "entry_point"],
        inspect_task="inspect_evals/humaneval",
    )  # fmt: skip
    samples, rows = run_final(benchmark, theta0, tmp_path)
    assert_records(samples, rows, theta0, "code_tests")
    assert all(r["inspect_score"] is None for r in rows)  # Inspect's scorer would run code outside our sandbox
    score = benchmark_scorer(benchmark=benchmark)
    canonical = {r["task_id"]: r["canonical_solution"] for r in humaneval("Fin")}
    assert all(score(canonical[s["id"]], s["answer"]) for s in samples)
    assert not any(score("    return x\n", s["answer"]) for s in samples[1:])


def test_bfcl_format_through_a_sealed_task_module(sealed_root, inspect_env, theta0, tmp_path):
    task_file = tmp_path / "bfcl_task.py"
    task_file.write_text(BFCL_TASK)
    benchmark = benchmark_add(
        name="bfcl/inspect", feedback_file=write(tmp_path / "fb.jsonl", bfcl("fb")),
        final_file=write(tmp_path / "fin.jsonl", bfcl("fin")), evaluator="json_call", decoding=DECODING,
        prompt_field="question", answer_fields=["ground_truth"], inspect_task="file", inspect_task_file=task_file,
        inspect_task_function="bfcl_simple",
    )  # fmt: skip
    assert "inspect_task.py" in benchmark.contract["code_sha256"]
    samples, rows = run_final(benchmark, theta0, tmp_path)
    assert_records(samples, rows, theta0, "json_call", needle=lambda s: s["record"]["question"][0][0]["content"])
    assert all("Call one tool as JSON" in prompt for prompt, _ in theta0["calls"])
    score = benchmark_scorer(benchmark=benchmark)
    assert score('{"name": "get_weather", "arguments": {"city": "Paris"}}', samples[0]["answer"])
    assert not score('{"name": "get_weather", "arguments": {"city": "Lima"}}', samples[0]["answer"])

    # A changed task file is refused before anything runs: the sealed copy by the seal, and a
    # task source that differs from the registered hash by the runner itself.
    sealed_task = Path(benchmark.sealed_path) / "inspect_task.py"
    original = sealed_task.read_text()
    sealed_task.chmod(0o644)
    sealed_task.write_text(original.replace("Call one tool", "Answer 42. Call one tool"))
    with pytest.raises(SealBroken, match="task code inspect_task.py changed"):
        benchmark_load_sealed(benchmark=benchmark, split="final")
    theta0["calls"].clear()
    with pytest.raises(HarnessRefused, match="inspect task source changed"):
        inspect_evaluate(
            contract=benchmark.contract, sealed_path=Path(benchmark.sealed_path), samples=samples, model_id="theta0",
            generate=theta0["generate"], chat_template=None, scorer=lambda o, a: False, log_dir=tmp_path / "logs2",
        )  # fmt: skip
    assert theta0["calls"] == []  # refused before any generation


def test_sampled_decoding_through_inspect_uses_each_samples_own_seed(
    sealed_root, inspect_env, theta0_sampled, tmp_path
):
    """Inspect sends one seed with every request; the endpoint samples under sha256(run seed, id, epoch, call)."""
    benchmark = benchmark_add(
        name="gsm8k/sampled", feedback_file=write(tmp_path / "fb.jsonl", gsm8k("fb")),
        final_file=write(tmp_path / "fin.jsonl", gsm8k("fin")), evaluator="gsm8k_numeric", decoding=SAMPLED,
        prompt_field="question", inspect_task="inspect_evals/gsm8k", inspect_task_args={"fewshot": 0},
    )  # fmt: skip
    samples, _ = benchmark_load_sealed(benchmark=benchmark, split="final")
    engine = theta0_sampled
    common = {
        "contract": benchmark.contract, "sealed_path": Path(benchmark.sealed_path), "samples": samples,
        "model_id": "theta0", "chat_template": None, "scorer": benchmark_scorer(benchmark=benchmark),
        "log_dir": tmp_path / "logs",
    }  # fmt: skip
    engine["seeds"].clear()
    results = inspect_evaluate_seeds(seeds=[0, 1], generate=engine["generate"], **common)
    assert [(r["seed"], r["status"]) for r in results] == [(0, "ok"), (1, "ok")]
    for result in results:
        # Each sample's record names the seed it was sampled under: its own, never Inspect's one seed.
        assert [r["seed"] for r in result["rows"]] == [sample_seed(result["seed"], s["id"]) for s in samples]
    assert sorted(engine["seeds"]) == sorted(sample_seed(k, s["id"]) for k in (0, 1) for s in samples)
    outputs = [[r["output"] for r in result["rows"]] for result in results]
    assert len(set(outputs[0])) > len(samples) // 2  # not one shared random stream
    again = inspect_evaluate_seeds(seeds=[0], generate=engine["generate"], **common)
    assert [r["output"] for r in again[0]["rows"]] == outputs[0]  # reproducible from the record

    def refusing(prompt, max_tokens, stop, seed):
        raise VLLMRefused("prompt + max_tokens exceed the context")

    # A seed whose generations fail through the whole retry cascade is recorded failed, not dropped.
    failed = inspect_evaluate_seeds(seeds=[2], generate=refusing, **common)
    assert [(r["seed"], r["status"]) for r in failed] == [(2, "failed")]
    assert "every retry failed" in failed[0]["error"]
