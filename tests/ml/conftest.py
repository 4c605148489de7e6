"""Session fixtures for the ML tests: one ci minibench and the trained checkpoints they share.

Building and training dominate the runtime, so each happens once per session. Set
RSI_MINIBENCH_CACHE=/some/dir to keep the built minibench between sessions: a build there with the
same seed, profile, manifest version and source digest is reused; a missing, empty or stale one is
(re)built in place.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from apps.benchmarks.minibench import build_minibench
from apps.benchmarks.minibench.build import MANIFEST_VERSION, REFERENCE_HPARAMS, source_digest

SEED = 0
PROFILE = "ci"


def _is_reusable(root: Path) -> bool:
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        return False
    manifest = json.loads(manifest_path.read_text())
    found = tuple(manifest.get(k) for k in ("version", "seed", "profile", "source_digest"))
    return found == (MANIFEST_VERSION, SEED, PROFILE, source_digest())


def _build_into_cache(root: Path) -> None:
    # Build beside the target and swap it in, so a concurrent session never sees half a build.
    staging = root.parent / f".{root.name}.building-{os.getpid()}"
    stale = root.parent / f".{root.name}.stale-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    build_minibench(staging, seed=SEED, profile=PROFILE)
    if root.exists():
        root.rename(stale)
    try:
        staging.rename(root)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another session swapped its build in first
    shutil.rmtree(stale, ignore_errors=True)


@pytest.fixture(scope="session")
def minibench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Root of a built ci minibench (built once per session, or reused from the cache dir)."""
    cache = os.environ.get("RSI_MINIBENCH_CACHE")
    if cache:
        root = Path(cache)
        if not _is_reusable(root):
            _build_into_cache(root)
        if _is_reusable(root):
            return root
    root = tmp_path_factory.mktemp("minibench") / "ci"
    build_minibench(root, seed=SEED, profile=PROFILE)
    return root


@pytest.fixture(scope="session")
def arithmetic_task(minibench: Path) -> dict[str, Any]:
    return json.loads((minibench / "tasks" / "arithmetic" / "task.json").read_text())


@pytest.fixture(scope="session")
def feedback_samples(minibench: Path) -> list[dict[str, Any]]:
    path = minibench / "tasks" / "arithmetic" / "feedback.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _train_in_child(hparams: dict[str, Any], base: str, data: str, out: str) -> dict[str, Any]:
    # Module-level so a spawned process can import it.
    from workers.gpu.hparams import validate_train_config
    from workers.gpu.runners import train

    result = train(validate_train_config(hparams), base_dir=Path(base), data_files=[Path(data)], out_dir=Path(out))
    return {"steps": result.steps, "final_loss": result.final_loss, "seconds": result.seconds}


# The recipe the ci reference was trained with; each broken run changes exactly one thing.
GOOD_RECIPE: dict[str, Any] = {**REFERENCE_HPARAMS, "seed": SEED, "num_threads": 1}


@pytest.fixture(scope="session")
def broken_runs(minibench: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two runs of the reference recipe with one bug each: no EOS, or only 300 training rows.

    They run side by side as single-threaded processes: on a small CPU that nearly doubles the
    throughput of one two-threaded run.
    """
    out = tmp_path_factory.mktemp("broken")
    base = str(minibench / "theta0")
    clean = str(minibench / "catalog" / "arithmetic-clean" / "data.jsonl")
    tiny = str(minibench / "catalog" / "arithmetic-tiny" / "data.jsonl")
    jobs = {
        "no_eos": ({**GOOD_RECIPE, "eos_handling": "none"}, clean),
        "tiny": (GOOD_RECIPE, tiny),
    }
    with ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {
            name: pool.submit(_train_in_child, hparams, base, data, str(out / name))
            for name, (hparams, data) in jobs.items()
        }
        for future in futures.values():
            future.result()
    return {name: out / name for name in jobs}
