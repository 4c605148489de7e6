"""Training runner on the real tiny model: the good recipe works, the classic bugs visibly fail,
cancel is cooperative, and every checkpoint is a plain safetensors model with θ0's tokenizer."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM

from apps.core.hashing import sha256_tree
from apps.ml.hparams import validate_train_config
from apps.ml.inference import evaluate
from apps.ml.training import Cancelled, TrainHooks, train

pytestmark = pytest.mark.slow
log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def _results(checkpoint: Path, task: dict[str, Any], samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return evaluate(checkpoint_dir=checkpoint, samples=samples, task=task)


def _data(minibench: Path, dataset: str) -> list[Path]:
    return [minibench / "catalog" / dataset / "data.jsonl"]


def _accuracy(results: list[dict[str, Any]]) -> float:
    return sum(r["correct"] for r in results) / len(results)


def test_sft_on_clean_data_works_and_broken_recipes_do_not(
    minibench: Path,
    broken_runs: dict[str, Path],
    arithmetic_task: dict[str, Any],
    feedback_samples: list[dict[str, Any]],
) -> None:
    theta0 = _accuracy(_results(minibench / "theta0", arithmetic_task, feedback_samples))
    # The ci reference is trained by this runner with the good recipe during the build.
    reference = _accuracy(_results(minibench / "references" / "arithmetic", arithmetic_task, feedback_samples))
    no_eos_results = _results(broken_runs["no_eos"], arithmetic_task, feedback_samples)
    no_eos = _accuracy(no_eos_results)
    tiny = _accuracy(_results(broken_runs["tiny"], arithmetic_task, feedback_samples))
    scores = {"theta0": theta0, "reference": reference, "no_eos": no_eos, "tiny": tiny}
    log.info("arithmetic feedback exact match: %s", scores)  # shown with --log-cli-level=INFO
    assert theta0 < 0.10, scores
    assert reference > 0.50, scores
    assert no_eos < reference - 0.3, scores
    assert tiny < reference - 0.3, scores
    # Without EOS in training the model does not stop: most outputs run on past the answer.
    runs_on = sum(len(r["output"].strip()) > 3 for r in no_eos_results)
    assert runs_on > len(no_eos_results) // 2, no_eos_results[:5]


def test_cooperative_cancel_stops_training_and_leaves_no_checkpoint(minibench: Path, tmp_path: Path) -> None:
    heartbeats: list[int] = []
    out = tmp_path / "cancelled"
    hooks = TrainHooks(heartbeat=lambda: heartbeats.append(1), should_stop=lambda: len(heartbeats) >= 3)
    config = validate_train_config({"max_steps": 1000, "batch_size": 8})
    with pytest.raises(Cancelled):
        train(
            config,
            base_dir=minibench / "theta0",
            data_files=_data(minibench, "arithmetic-clean"),
            out_dir=out,
            hooks=hooks,
        )
    assert len(heartbeats) == 3  # stopped right after the step that saw the flag
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no staging leftovers either


@pytest.mark.parametrize(
    ("hparams", "dataset"),
    [
        ({"adapter": "lora", "lora_r": 4, "learning_rate": 5e-3}, "arithmetic-clean"),
        ({"recipe": "dpo", "dpo_beta": 0.1}, "arithmetic-prefs"),
        ({"recipe": "dpo", "adapter": "lora", "chat_template": "apply"}, "arithmetic-prefs"),
        ({"chat_template": "apply"}, "arithmetic-clean"),
    ],
)
def test_every_recipe_writes_a_plain_full_checkpoint(
    minibench: Path,
    tmp_path: Path,
    hparams: dict[str, Any],
    dataset: str,
    arithmetic_task: dict[str, Any],
    feedback_samples: list[dict[str, Any]],
) -> None:
    logs: list[tuple[int, dict[str, float]]] = []
    progress: list[float] = []
    out = tmp_path / "ckpt"
    config = validate_train_config({**hparams, "max_steps": 4, "batch_size": 8, "logging_steps": 2})
    result = train(
        config,
        base_dir=minibench / "theta0",
        data_files=_data(minibench, dataset),
        out_dir=out,
        hooks=TrainHooks(on_log=lambda s, m: logs.append((s, m)), on_progress=progress.append),
    )
    assert result.steps == 4
    assert result.out_dir == out
    assert result.tokens_per_second > 0
    assert any("loss" in m and m["tokens_per_second"] > 0 for _, m in logs)
    assert progress[-1] == 1.0
    names = {p.name for p in out.iterdir()}
    assert "model.safetensors" in names
    assert not names & {"adapter_config.json", "adapter_model.safetensors", "pytorch_model.bin", "training_args.bin"}
    # LoRA was merged: the checkpoint loads as a plain model with θ0's shapes.
    model = AutoModelForCausalLM.from_pretrained(out, use_safetensors=True)
    base = AutoModelForCausalLM.from_pretrained(minibench / "theta0", use_safetensors=True)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in base.parameters())
    # The tokenizer is θ0's, byte for byte.
    ours, theirs = sha256_tree(out), sha256_tree(minibench / "theta0")
    for name in TOKENIZER_FILES:
        assert ours[name] == theirs[name], name
    assert len(_results(out, arithmetic_task, feedback_samples[:4])) == 4


def test_recipe_and_data_format_must_match(minibench: Path, tmp_path: Path) -> None:
    config = validate_train_config({"recipe": "dpo", "max_steps": 1})
    with pytest.raises(ValueError, match="looks like sft data"):
        train(
            config,
            base_dir=minibench / "theta0",
            data_files=_data(minibench, "arithmetic-tiny"),
            out_dir=tmp_path / "x",
        )
    assert not (tmp_path / "x").exists()


def test_train_refuses_a_non_empty_output_dir(minibench: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "model.safetensors").write_bytes(b"")
    config = validate_train_config({"max_steps": 1})
    with pytest.raises(FileExistsError):
        train(
            config,
            base_dir=minibench / "theta0",
            data_files=_data(minibench, "arithmetic-tiny"),
            out_dir=tmp_path / "taken",
        )


def test_manifest_hashes_every_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.json").write_text(json.dumps({"x": 1}))
    (tmp_path / "sub" / "b.bin").write_bytes(b"\x00\x01")
    assert sha256_tree(tmp_path) == {
        "a.json": hashlib.sha256(b'{"x": 1}').hexdigest(),
        "sub/b.bin": hashlib.sha256(b"\x00\x01").hexdigest(),
    }
