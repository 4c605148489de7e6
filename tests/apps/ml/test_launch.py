"""Multi-device training through Accelerate's launcher, on CPU over gloo with 2 processes.

Stated tolerance: float32 on CPU, the only differences between 1 and 2 processes are the order of
additions (gradient all-reduce, token-count averaging), so every logged loss agrees to 1e-3
relative and the checkpoints' evaluation loss to 1e-3 relative too.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from apps.ml.checkpoints import load_checkpoint
from apps.ml.hparams import validate_train_config
from apps.ml.launch import RankFailed, launch_command, launch_train, per_device_config
from apps.ml.training import Cancelled, TrainHooks
from tests.support.tiny_chat import build_tiny_chat_model

pytestmark = pytest.mark.slow

TOLERANCE = 1e-3
RECIPE = {"max_steps": 6, "batch_size": 8, "learning_rate": 5e-3, "logging_steps": 1, "num_threads": 1,
          "lr_scheduler_type": "constant", "max_length": 32}  # fmt: skip


def _rows() -> list[dict[str, str]]:
    return [{"prompt": f"{a}+{b}=", "completion": f" {a + b}"} for a in range(8) for b in range(8)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("launch")
    rows = _rows()
    model = build_tiny_chat_model(root / "theta0", [r["prompt"] + r["completion"] for r in rows] * 4)
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model, data


def _train(tiny: tuple[Path, Path], out: Path, devices: int) -> tuple[list[float], list[float]]:
    losses: list[float] = []
    progress: list[float] = []
    hooks = TrainHooks(on_log=lambda step, m: losses.append(m["loss"]) if "loss" in m else None,
                       on_progress=progress.append)  # fmt: skip
    result = launch_train(validate_train_config(RECIPE), base_dir=tiny[0], data_files=[tiny[1]], out_dir=out,
                          devices=devices, hooks=hooks)  # fmt: skip
    assert result.steps == RECIPE["max_steps"]
    assert result.out_dir == out
    return losses, progress


def _eval_loss(checkpoint: Path) -> float:
    model, tokenizer = load_checkpoint(checkpoint)
    text = [r["prompt"] + r["completion"] for r in _rows()]
    batch = tokenizer(text, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    with torch.no_grad():
        return float(model(**batch, labels=labels).loss)


def test_two_processes_train_like_one_at_the_same_global_batch(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    one, one_progress = _train(tiny, tmp_path / "one", devices=1)
    two, two_progress = _train(tiny, tmp_path / "two", devices=2)
    assert len(one) == len(two) == RECIPE["max_steps"]  # reported once, not once per rank
    assert two == pytest.approx(one, rel=TOLERANCE)
    assert one[-1] < one[0] - 0.5  # it did learn: the comparison is not between two flat curves
    assert two_progress[-1] == one_progress[-1] == 1.0
    # One checkpoint, written once, no staging leftovers of either rank.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]
    assert len(list((tmp_path / "two").glob("*.safetensors"))) == 1
    assert _eval_loss(tmp_path / "two") == pytest.approx(_eval_loss(tmp_path / "one"), rel=TOLERANCE)


def test_a_failing_rank_fails_the_job_with_its_error(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "completion": " 2"}\n{"prompt": "2+2="}\n')
    with pytest.raises(RankFailed) as info:
        launch_train(validate_train_config(RECIPE), base_dir=tiny[0], data_files=[bad], out_dir=tmp_path / "out",
                     devices=2)  # fmt: skip
    assert info.value.rank in (0, 1)
    assert "ValueError: row 1: recipe 'sft' needs string fields" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def _rank_pid(launcher_root: int, rank: int) -> int | None:
    """The pid of the process started with RANK=rank in the launcher's tree (found through /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ours = f"RSI_LAUNCH_TEST={launcher_root}".encode() in environ and b"apps.ml.launch" in cmdline
        if ours and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def test_a_killed_rank_fails_the_job_naming_that_rank(
    tiny: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Like the kernel's OOM killer: rank 1 dies by SIGKILL mid-training, with no chance to report.
    monkeypatch.setenv("RSI_LAUNCH_TEST", str(os.getpid()))
    killed: list[int] = []

    def kill_rank_1() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            pid = _rank_pid(os.getpid(), 1)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.2)

    killer = threading.Thread(target=kill_rank_1)
    killer.start()
    config = validate_train_config({**RECIPE, "max_steps": 2000})
    try:
        with pytest.raises(RankFailed) as info:
            launch_train(config, base_dir=tiny[0], data_files=[tiny[1]], out_dir=tmp_path / "out", devices=2)
    finally:
        killer.join()
    assert killed
    assert "rank 1" in str(info.value) or "local_rank: 1" in str(info.value), str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_cancel_stops_every_rank_and_leaves_no_checkpoint(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    steps: list[int] = []
    hooks = TrainHooks(on_log=lambda step, m: steps.append(step), should_stop=lambda: len(steps) >= 2)
    config = validate_train_config({**RECIPE, "max_steps": 2000})
    with pytest.raises(Cancelled):
        launch_train(config, base_dir=tiny[0], data_files=[tiny[1]], out_dir=tmp_path / "out", devices=2, hooks=hooks)
    assert list(tmp_path.iterdir()) == []


def test_bad_device_settings_are_refused_before_launching() -> None:
    config = validate_train_config(RECIPE)
    with pytest.raises(ValueError, match="divisible by the 3 devices"):
        per_device_config(config, 3)
    with pytest.raises(ValueError, match=r"allowed \[1, 8\]"):
        per_device_config(config, 9)
    assert per_device_config(config, 4).batch_size == 2
    with pytest.raises(ValueError, match="needs CUDA"):
        launch_command(devices=2, strategy="fsdp", spec_path=Path("spec.json"), on_gpu=False)
    with pytest.raises(ValueError, match="strategy must be one of"):
        launch_command(devices=2, strategy="zero9", spec_path=Path("spec.json"), on_gpu=False)
