"""Training on several devices through Accelerate's launcher, not a launcher of our own.

`launch_train` runs the same `training.train` as a one-device job, once per rank, under
``accelerate launch`` (torch.distributed's elastic agent underneath): DDP by default, or FSDP /
DeepSpeed ZeRO-3 from a named config in ``apps/ml/accelerate/`` for models that do not fit one
device. On a host without CUDA the ranks are CPU processes that talk over gloo, which is how CI
runs it (2 processes).

What the one-device path promises holds here too:

- the recipe's ``batch_size`` is the *global* batch; each of N ranks gets ``batch_size / N``, so a
  recipe trains the same on 1 or N devices (the loss curve matches within float tolerance);
- one checkpoint, written once by the main process, appearing atomically in ``out_dir``;
- progress and metrics reported once: rank 0 writes them as JSON lines to an events file that
  this process reads and hands to the caller's `TrainHooks`;
- a failure in any rank fails the job with that rank's error (`RankFailed`), and the elastic agent
  stops the other ranks;
- cancel is `TrainHooks.should_stop()`, polled here: the launcher's process group is stopped
  (SIGTERM, each rank cleans its staging directory) and `Cancelled` is raised.
"""

from __future__ import annotations

import apps.ml.offline  # noqa: F401 - before transformers: the Hub stays off

# isort: split
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from apps.core.procs import Lifeline
from apps.ml.hparams import TrainConfig, validate_train_config
from apps.ml.training import Cancelled, TrainHooks, TrainResult, train

# The job runner's one door to training (workers.gpu.tasks imports these from here).
__all__ = ["Cancelled", "RankFailed", "TrainHooks", "TrainResult", "launch_train"]

MAX_DEVICES = 8
CONFIG_DIR = Path(__file__).with_name("accelerate")
# Strategy name -> Accelerate config file (None: DDP from the command line alone).
STRATEGIES: dict[str, str | None] = {
    "ddp": None,
    "fsdp": "fsdp.yaml",
    "deepspeed-zero3": "deepspeed-zero3.yaml",
}
_POLL_SECONDS = 0.5
_STOP_GRACE_SECONDS = 30
_LAUNCHER_TAIL_CHARS = 4000


class RankFailed(RuntimeError):
    """One rank of a multi-device job failed; its message is that rank's error."""

    def __init__(self, rank: int | None, error: str) -> None:
        self.rank = rank
        self.error = error
        where = f"rank {rank}" if rank is not None else "the launcher"
        super().__init__(f"{where} failed: {error}")


def per_device_config(config: TrainConfig, devices: int) -> TrainConfig:
    """The recipe each of `devices` ranks trains with: the same global batch, split evenly."""
    if not 1 <= devices <= MAX_DEVICES:
        raise ValueError(f"devices={devices} is out of range; allowed [1, {MAX_DEVICES}]")
    if config.batch_size % devices:
        raise ValueError(
            f"batch_size={config.batch_size} (the global batch) must be divisible by the {devices} devices"
        )
    return dataclasses.replace(config, batch_size=config.batch_size // devices)


def launch_command(*, devices: int, strategy: str, spec_path: Path, on_gpu: bool) -> list[str]:
    """The ``accelerate launch`` command line that runs `devices` ranks of this module."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--quiet"]
    config_name = STRATEGIES[strategy]
    if config_name is not None:
        if not on_gpu:
            raise ValueError(f"strategy {strategy!r} needs CUDA devices; on CPU only 'ddp' runs")
        cmd += ["--config_file", str(CONFIG_DIR / config_name)]
    else:
        # Without --cpu: on a CPU-only host the ranks still start through torch.distributed.run,
        # and the Trainer (use_cpu) joins them over gloo.
        cmd += ["--multi_gpu", "--mixed_precision", "bf16" if on_gpu else "no"]
    cmd += [
        "--num_machines", "1",
        "--num_processes", str(devices),
        "--dynamo_backend", "no",
        "--main_process_port", "0",  # a free port: jobs side by side do not collide
        "-m", __name__, str(spec_path),
    ]  # fmt: skip
    return cmd


def launch_train(
    config: TrainConfig,
    *,
    base_dir: Path,
    data_files: list[Path],
    out_dir: Path,
    devices: int,
    strategy: str = "ddp",
    hooks: Any = None,
    visible_devices: list[int] | None = None,
) -> Any:
    """Train like `training.train` on `devices` devices of this host; returns its TrainResult.

    One device runs in this process, exactly as before. ``visible_devices``: the CUDA device
    indices the scheduler gave the job (apps.jobs ``Job.devices``), made the ranks' only ones.
    Raises `RankFailed` when a rank fails,
    `Cancelled` on cooperative cancel, and ValueError for settings that cannot run.
    """
    hooks = hooks or TrainHooks()
    rank_config = per_device_config(config, devices)
    if strategy != "ddp" and config.adapter == "lora":
        raise ValueError(f"strategy {strategy!r} trains full models only; LoRA runs with 'ddp'")
    if devices == 1 and strategy == "ddp":
        return train(config, base_dir=base_dir, data_files=data_files, out_dir=out_dir, hooks=hooks)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"output directory {out_dir} is not empty")
    with tempfile.TemporaryDirectory(prefix="rsi-launch-") as tmp:
        run_dir = Path(tmp)
        spec = {
            "config": dataclasses.asdict(rank_config),
            "base_dir": str(base_dir),
            "data_files": [str(p) for p in data_files],
            "out_dir": str(out_dir),
            "run_dir": str(run_dir),
        }
        spec_path = run_dir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        cmd = launch_command(devices=devices, strategy=strategy, spec_path=spec_path, on_gpu=torch.cuda.is_available())
        events = _Events(run_dir / "events.jsonl", hooks)
        started = time.monotonic()
        with (run_dir / "launcher.log").open("wb") as launcher_log:
            env = dict(os.environ)
            if visible_devices and torch.cuda.is_available():
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in visible_devices)
            proc = subprocess.Popen(cmd, stdout=launcher_log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        lifeline = Lifeline([proc.pid])
        try:
            while proc.poll() is None:
                events.read()
                if hooks.should_stop is not None and hooks.should_stop():
                    _stop(proc)
                    _remove_staging(out_dir)
                    raise Cancelled(f"training cancelled at step {events.step}")
                time.sleep(_POLL_SECONDS)
            events.read()
        finally:
            if proc.poll() is None:
                _stop(proc)
            lifeline.forget(proc.pid)
            lifeline.close()
        if proc.returncode != 0 or events.result is None:
            _remove_staging(out_dir)
            raise _failure(run_dir, proc.returncode)
        result = events.result
        return TrainResult(
            steps=int(result["steps"]),
            final_loss=float(result["final_loss"]),
            tokens_per_second=float(result["tokens_per_second"]),
            seconds=time.monotonic() - started,
            out_dir=out_dir,
        )


class _Events:
    """Reads rank 0's events file incrementally and hands each event to the caller's hooks."""

    def __init__(self, path: Path, hooks: Any) -> None:
        self.path = path
        self.hooks = hooks
        self.offset = 0
        self.step = 0
        self.result: dict[str, Any] | None = None

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        for line in data[:end].splitlines():
            event = json.loads(line)
            kind = event["event"]
            if kind == "log":
                self.step = int(event["step"])
                if self.hooks.on_log is not None:
                    self.hooks.on_log(self.step, event["metrics"])
            elif kind == "progress" and self.hooks.on_progress is not None:
                self.hooks.on_progress(float(event["value"]))
            elif kind == "heartbeat" and self.hooks.heartbeat is not None:
                self.hooks.heartbeat()
            elif kind == "result":
                self.result = event


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the launcher's group (the elastic agent passes it on to the ranks), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, _STOP_GRACE_SECONDS), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _remove_staging(out_dir: Path) -> None:
    # A rank killed outright cannot remove its own staging directory (training.train's finally).
    for leftover in out_dir.parent.glob(f".{out_dir.name}.partial-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _failure(run_dir: Path, returncode: int | None) -> RankFailed:
    """The first rank's recorded error, or the launcher's output when no rank recorded one."""
    errors = []
    for path in run_dir.glob("rank-*.error.json"):
        errors.append(json.loads(path.read_text()))
    if errors:
        first = min(errors, key=lambda e: e["time"])
        return RankFailed(first["rank"], first["error"])
    tail = (run_dir / "launcher.log").read_text(errors="replace")[-_LAUNCHER_TAIL_CHARS:]
    return RankFailed(None, f"exit code {returncode}; output ends:\n{tail}")


# --- one rank (run by accelerate launch as `python -m apps.ml.launch SPEC`) ---


def _rank_main(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    run_dir = Path(spec["run_dir"])
    rank = int(os.environ.get("RANK", "0"))

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # so train()'s finally removes this rank's staging

    signal.signal(signal.SIGTERM, stop)
    events_path = run_dir / "events.jsonl"

    def emit(event: dict[str, Any]) -> None:
        with events_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(event) + "\n")

    hooks = TrainHooks()
    if rank == 0:
        hooks = TrainHooks(
            on_log=lambda step, metrics: emit({"event": "log", "step": step, "metrics": metrics}),
            on_progress=lambda value: emit({"event": "progress", "value": value}),
            heartbeat=lambda: emit({"event": "heartbeat"}),
        )
    try:
        config = validate_train_config(spec["config"])
        result = train(
            config,
            base_dir=Path(spec["base_dir"]),
            data_files=[Path(p) for p in spec["data_files"]],
            out_dir=Path(spec["out_dir"]),
            hooks=hooks,
        )
    except BaseException as exc:
        if not isinstance(exc, SystemExit):
            error = {
                "rank": rank,
                "time": time.time(),
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
            (run_dir / f"rank-{rank}.error.json").write_text(json.dumps(error))
        raise
    if rank == 0:
        emit({
            "event": "result",
            "steps": result.steps,
            "final_loss": result.final_loss,
            "tokens_per_second": result.tokens_per_second,
        })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(_rank_main(Path(sys.argv[1])))
