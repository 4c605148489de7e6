"""Session fixtures for the ML tests: the shared ci minibench and the trained checkpoints they share.

Building and training dominate the runtime, so each happens once per session. The minibench is
the one every suite shares (tests/support/minibench.py: built under a lock into
RSI_MINIBENCH_CACHE when set, and rebuilt there when the builder's code changed).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from apps.benchmarks.minibench.build import REFERENCE_HPARAMS
from apps.core.procs import die_with_parent
from apps.ml.hparams import validate_train_config
from tests.support.minibench import SEED, ci_minibench, trained_once


@pytest.fixture(scope="session")
def minibench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Root of the built ci minibench."""
    return ci_minibench(tmp_path_factory)


@pytest.fixture(scope="session")
def arithmetic_task(minibench: Path) -> dict[str, Any]:
    return json.loads((minibench / "tasks" / "arithmetic" / "task.json").read_text())


@pytest.fixture(scope="session")
def feedback_samples(minibench: Path) -> list[dict[str, Any]]:
    path = minibench / "tasks" / "arithmetic" / "feedback.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _train_in_child(hparams: dict[str, Any], base: str, data: str, out: str) -> dict[str, Any]:
    # Module-level so a spawned process can import it.
    from apps.ml.training import train  # noqa: PLC0415 - heavy (TRL); runs in the spawned child

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
    base = str(minibench / "theta0")
    clean = str(minibench / "catalog" / "arithmetic-clean" / "data.jsonl")
    tiny = str(minibench / "catalog" / "arithmetic-tiny" / "data.jsonl")
    jobs = {
        "no_eos": ({**GOOD_RECIPE, "eos_handling": "none"}, clean),
        "tiny": (GOOD_RECIPE, tiny),
    }

    def train_both(out: Path) -> None:
        with ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("spawn"),
                                 initializer=die_with_parent, initargs=(os.getpid(),)) as pool:  # fmt: skip
            futures = [
                pool.submit(_train_in_child, hparams, base, data, str(out / name))
                for name, (hparams, data) in jobs.items()
            ]
            for future in futures:
                future.result()

    # Trained once per training code (the minibench cache's digest), not once per session.
    what = {name: {"hparams": hparams, "data": Path(data).relative_to(minibench).as_posix()}
            for name, (hparams, data) in jobs.items()}  # fmt: skip
    out = trained_once(tmp_path_factory, {"broken_runs": what}, train_both)
    return {name: out / name for name in jobs}
