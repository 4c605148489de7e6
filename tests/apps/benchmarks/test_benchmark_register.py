"""Sealed benchmarks: hashes at registration, verification before every load, refusal on tampering."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import (
    SealBroken,
    benchmark_load_sealed,
    benchmark_register,
    benchmark_resolve,
    benchmark_scorer,
    benchmark_sealed_items,
)
from apps.core.errors import ApplicationError
from apps.experiments.models import Event
from apps.ml import evaluators
from tests.apps.benchmarks.minibench_fixture import FEEDBACK, FINAL, TASK_JSON, write_task_dir

pytestmark = pytest.mark.django_db


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tamper(path: Path, offset: int = 10) -> None:
    """Flip one byte of a sealed (read-only) file, as an attacker with write access would."""
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_register_seals_files_and_hashes(sealed_root, task_dir):
    benchmark = benchmark_register(name="test/addition", task_dir=task_dir)

    sealed = Path(benchmark.sealed_path)
    assert sealed == sealed_root.resolve() / "test" / "addition" / "1"
    assert sorted(p.name for p in sealed.iterdir()) == [
        "evaluator.py", "feedback.jsonl", "final.jsonl", "sandbox.py", "task.json"
    ]  # fmt: skip
    assert not any(os.access(p, os.W_OK) and p.stat().st_mode & 0o222 for p in sealed.iterdir())
    assert benchmark.evaluator == "exact_match"
    assert benchmark.task == "addition"
    assert benchmark.evaluator_sha256 == sha(Path(evaluators.__file__)) == sha(sealed / "evaluator.py")
    assert benchmark.data_sha256 == {
        "feedback": sha(task_dir / "feedback.jsonl"),
        "final": sha(task_dir / "final.jsonl"),
    }
    assert benchmark.settings == TASK_JSON
    assert benchmark.sample_ids == {"feedback": [r["id"] for r in FEEDBACK], "final": [r["id"] for r in FINAL]}
    assert Event.objects.filter(type="benchmark.registered", result_ref=f"benchmark:{benchmark.uuid}").exists()
    # The contract writes the greedy decoding out explicitly and names every sealed code file.
    assert benchmark.contract["decoding"] == {
        "temperature": 0.0, "top_p": 1.0, "max_tokens": 8, "stop": ["\n"], "seed_policy": "greedy-single-seed"
    }  # fmt: skip
    assert benchmark.contract["code_sha256"] == {
        "evaluator.py": sha(sealed / "evaluator.py"),
        "sandbox.py": sha(sealed / "sandbox.py"),
    }
    assert (benchmark.contract["adapter"], benchmark.contract["metric"]) == ("builtin", "accuracy")


def test_load_verifies_and_returns_the_split_with_its_seal(sealed_root, task_dir):
    benchmark = benchmark_register(name="test/addition", task_dir=task_dir)
    rows, info = benchmark_load_sealed(benchmark=benchmark, split="feedback")
    assert rows == FEEDBACK
    assert info["prompt_template"] == TASK_JSON["prompt_template"]
    assert info["stop"] == ["\n"]
    assert info["seal"]["data_sha256"] == benchmark.data_sha256["feedback"]
    assert info["seal"]["samples"] == len(FEEDBACK)
    items = benchmark_sealed_items(benchmark=benchmark)
    assert [i["split"] for i in items] == ["feedback"] * len(FEEDBACK) + ["final"] * len(FINAL)
    with pytest.raises(ApplicationError) as bad_split:
        benchmark_load_sealed(benchmark=benchmark, split="train")
    assert bad_split.value.code == "invalid_split"


def test_one_tampered_byte_in_sealed_data_is_refused_with_the_reason(sealed_root, task_dir):
    benchmark = benchmark_register(name="test/addition", task_dir=task_dir)
    benchmark_load_sealed(benchmark=benchmark, split="final")
    tamper(Path(benchmark.sealed_path) / "final.jsonl", offset=40)

    with pytest.raises(SealBroken) as refused:
        benchmark_load_sealed(benchmark=benchmark, split="final")
    assert refused.value.code == "seal_broken"
    assert "final.jsonl changed" in refused.value.reason
    # The other split still verifies; the refusal is recorded as evidence.
    benchmark_load_sealed(benchmark=benchmark, split="feedback")
    event = Event.objects.get(type="benchmark.seal_broken")
    assert "final.jsonl" in event.arguments["reason"]


def test_a_tampered_evaluator_copy_is_refused(sealed_root, task_dir):
    benchmark = benchmark_register(name="test/addition", task_dir=task_dir)
    assert benchmark_scorer(benchmark=benchmark)("46", "46")
    evaluator = Path(benchmark.sealed_path) / "evaluator.py"
    evaluator.chmod(0o644)
    # The classic hack: an evaluator that accepts everything.
    evaluator.write_text(evaluator.read_text() + "\n\ndef score(evaluator_name, output, answer):\n    return True\n")

    for load in (
        lambda: benchmark_load_sealed(benchmark=benchmark, split="feedback"),
        lambda: benchmark_scorer(benchmark=benchmark),
    ):
        with pytest.raises(SealBroken) as refused:
            load()
        assert "evaluator code changed" in refused.value.reason


def test_the_sealed_evaluator_copy_scores_not_the_live_module(sealed_root, task_dir, tmp_path, monkeypatch):
    # Registered when evaluators.py held another exact_match: one that also takes "46 apples".
    registered = tmp_path / "evaluators_then.py"
    registered.write_text(
        Path(evaluators.__file__).read_text()
        + "\n\ndef _number_then_words(output, answer):\n"
        + "    return exact_match(output.strip().split(' ')[0], answer)\n\n\n"
        + "EVALUATORS['exact_match'] = _number_then_words\n"
    )
    with monkeypatch.context() as then:
        then.setattr(evaluators, "__file__", str(registered))
        benchmark = benchmark_register(name="test/addition", task_dir=task_dir)
    assert benchmark.evaluator_sha256 == sha(registered)
    # Today's live module disagrees, and is patched further to accept anything: neither matters.
    assert not evaluators.score("exact_match", "46 apples", "46")
    monkeypatch.setitem(evaluators.EVALUATORS, "exact_match", lambda output, answer: True)

    score = benchmark_scorer(benchmark=benchmark)

    assert score("46 apples", "46")
    assert score("46", "46")
    assert not score("45 apples", "46")
    assert not score("The answer is 46", "46")


def test_changed_settings_and_missing_files_are_refused(sealed_root, task_dir):
    benchmark = benchmark_register(name="test/addition", task_dir=task_dir)
    task_file = Path(benchmark.sealed_path) / "task.json"
    task_file.chmod(0o644)
    task_file.write_text(json.dumps({**TASK_JSON, "decoding": {"max_new_tokens": 64, "do_sample": True}}))
    with pytest.raises(SealBroken) as settings_changed:
        benchmark_load_sealed(benchmark=benchmark, split="feedback")
    assert "inference settings in task.json changed" in settings_changed.value.reason

    other = benchmark_register(name="test/other", task_dir=task_dir)
    Benchmark.objects.filter(pk=other.pk).update(settings={**TASK_JSON, "stop": []})
    other.refresh_from_db()
    with pytest.raises(SealBroken) as db_changed:
        benchmark_load_sealed(benchmark=other, split="feedback")
    assert "database" in db_changed.value.reason

    third = benchmark_register(name="test/third", task_dir=task_dir)
    (Path(third.sealed_path) / "feedback.jsonl").unlink()
    with pytest.raises(SealBroken) as missing:
        benchmark_load_sealed(benchmark=third, split="feedback")
    assert "feedback.jsonl is missing" in missing.value.reason


def test_a_changed_sample_list_is_refused(sealed_root, task_dir):
    benchmark = benchmark_register(name="test/addition", task_dir=task_dir)
    # Dropping a hard sample from the accounting is a sample-inclusion violation.
    Benchmark.objects.filter(pk=benchmark.pk).update(
        sample_ids={"feedback": [FEEDBACK[0]["id"]], "final": [r["id"] for r in FINAL]}
    )
    benchmark.refresh_from_db()
    with pytest.raises(SealBroken) as refused:
        benchmark_load_sealed(benchmark=benchmark, split="feedback")
    assert "sample ids" in refused.value.reason


def test_registration_is_idempotent_and_versions_changes(sealed_root, task_dir, tmp_path):
    first = benchmark_register(name="test/addition", task_dir=task_dir)
    assert benchmark_register(name="test/addition", task_dir=task_dir).pk == first.pk
    changed = write_task_dir(tmp_path / "changed", task={**TASK_JSON, "stop": ["\n", "."]})
    second = benchmark_register(name="test/addition", task_dir=changed)
    assert second.version == 2
    assert second.pk != first.pk
    assert benchmark_resolve("test/addition") == second
    assert benchmark_resolve("test/addition@1") == first
    assert benchmark_resolve(str(first.uuid)) == first
    with pytest.raises(ApplicationError) as taken:
        benchmark_register(name="test/addition", task_dir=changed, version=1)
    assert taken.value.code == "benchmark_exists"
    # Both versions' sealed copies stay where their rows say.
    benchmark_load_sealed(benchmark=first, split="feedback")
    benchmark_load_sealed(benchmark=second, split="feedback")


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"evaluator": "vibes"}, "evaluator"),
        ({"prompt_template": "no slot"}, "prompt_template"),
        ({"stop": "\n"}, "stop"),
    ],
)
def test_invalid_tasks_are_refused_before_anything_is_sealed(sealed_root, tmp_path, change, fragment):
    bad = write_task_dir(tmp_path / "bad", task={**TASK_JSON, **change})
    with pytest.raises(ApplicationError) as refused:
        benchmark_register(name="test/bad", task_dir=bad)
    assert refused.value.code == "invalid_task"
    assert fragment in refused.value.message
    assert not sealed_root.exists() or not any(sealed_root.rglob("*.jsonl"))
    assert not Benchmark.objects.filter(name="test/bad").exists()


def test_names_cannot_escape_the_sealed_root(sealed_root, task_dir):
    for name in ("../escape", "/abs", "a/../../b", "UPPER"):
        with pytest.raises(ApplicationError) as refused:
            benchmark_register(name=name, task_dir=task_dir)
        assert refused.value.code == "invalid_name"
