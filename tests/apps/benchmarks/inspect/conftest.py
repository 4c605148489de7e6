"""The Inspect suite: its own environment (built once per pin set by ./dev) and the minibench θ0.

This folder is its own session in tests/run_suites.py, so only this suite pays for the env.
The first build's time is printed (docs/benchmarks.md records it); later sessions reuse the env.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from apps.benchmarks.adapters import hf_generate, inspect_env_dir

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="session")
def inspect_env() -> Path:
    started = time.monotonic()
    cached = (inspect_env_dir() / ".rsiweb-ready").exists()
    done = subprocess.run(
        [str(ROOT / "dev"), "inspect-env"], capture_output=True, text=True, timeout=1_200, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    print(
        f"\ninspect env {'reused' if cached else 'built'} in {time.monotonic() - started:.1f} s: {done.stdout.strip()}"
    )
    return Path(done.stdout.strip())


GREEDY = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 6, "stop": [], "seed_policy": "greedy-single-seed"}
SAMPLED = {"temperature": 0.9, "top_p": 1.0, "max_tokens": 6, "stop": [], "seed_policy": "per-sample-seeds"}


def _engine(built_minibench, decoding):
    """θ0 on the real HF engine, recording each (prompt, completion, seed) the endpoint asked for."""
    manifest = json.loads((built_minibench / "manifest.json").read_text())
    checkpoint_dir = built_minibench / manifest["theta0"]
    generate, chat_template = hf_generate(checkpoint_dir, decoding)
    calls: list[tuple[str, str]] = []
    seeds: list[int | None] = []

    def recording(prompt: str, max_tokens: int, stop, seed) -> str:
        text = generate(prompt, max_tokens, stop, seed)
        calls.append((prompt, text))
        seeds.append(seed)
        return text

    return {
        "dir": checkpoint_dir,
        "generate": recording,
        "chat_template": chat_template,
        "calls": calls,
        "seeds": seeds,
    }


@pytest.fixture(scope="session")
def theta0(built_minibench):
    return _engine(built_minibench, GREEDY)


@pytest.fixture(scope="session")
def theta0_sampled(built_minibench):
    return _engine(built_minibench, SAMPLED)
