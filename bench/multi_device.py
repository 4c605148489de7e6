"""Throughput of a training on 2 processes (Accelerate's launcher, DDP) against 1, same global batch.

    python bench/multi_device.py [--steps 30] [--batch-size 16] [--devices 2]

Trains the tiny chat model (tests/support/tiny_chat.py, built here, nothing downloaded) on
arithmetic rows with `apps.ml.launch.launch_train`, once on 1 device and once on N, and prints
training seconds, tokens/s and the speed-up. On a CPU host the ranks are processes over gloo;
with CUDA, devices. `--require-devices` exits 0 with a printed reason when the host has fewer
CUDA devices than asked (bench/gpu_check.sh's multi-device case).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--require-devices", action="store_true", help="skip unless that many CUDA devices")
    args = parser.parse_args()

    import torch  # noqa: PLC0415 - after argparse: --help stays fast

    if args.require_devices and torch.cuda.device_count() < args.devices:
        have = torch.cuda.device_count()
        print(f"multi-device case skipped: this host has {have} CUDA device(s); it needs {args.devices}")
        return 0

    from apps.ml.hparams import validate_train_config  # noqa: PLC0415
    from apps.ml.launch import launch_train  # noqa: PLC0415
    from tests.support.tiny_chat import build_tiny_chat_model  # noqa: PLC0415

    rows = [{"prompt": f"{a}+{b}=", "completion": f" {a + b}"} for a in range(20) for b in range(20)]
    config = validate_train_config({"max_steps": args.steps, "batch_size": args.batch_size, "logging_steps": 5,
                                    "num_threads": 1, "max_length": 32})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = build_tiny_chat_model(root / "theta0", [r["prompt"] + r["completion"] for r in rows])
        data = root / "data.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = {}
        for devices in (1, args.devices):
            started = time.monotonic()
            result = launch_train(config, base_dir=base, data_files=[data], out_dir=root / f"out{devices}",
                                  devices=devices)  # fmt: skip
            wall = time.monotonic() - started
            out[devices] = (result, wall)
            print(f"{devices} device(s): {result.steps} steps, wall {wall:.1f} s (launcher and model load included), "
                  f"train {result.seconds:.1f} s, {result.tokens_per_second:.0f} tokens/s, "
                  f"final loss {result.final_loss:.4f}")  # fmt: skip
        one, many = out[1][1], out[args.devices][1]
        print(
            f"speed-up of {args.devices} over 1 (wall): {one / many:.2f}x on {torch.get_num_threads()} threads/process"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
