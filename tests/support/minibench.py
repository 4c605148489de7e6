"""The one built minibench every test session shares.

Building the ``ci`` minibench (tokenizer, θ0, tasks, catalog, reference) costs minutes on two
cores, so it is built once: into ``RSI_MINIBENCH_CACHE`` when set (``./dev test`` sets it, so
sessions on one checkout share it), else into the session's temp folder. A lock keeps two
sessions from building at once, and the build is renamed into place, so no one reads half a
build; a cache built by another version of the builder is rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from apps.benchmarks.minibench.build import MANIFEST_VERSION, build_minibench, source_digest

SEED = 0
PROFILE = "ci"


def manifest_matches(root: Path, expected: dict[str, Any]) -> bool:
    """Whether `root` holds a finished build whose manifest has every `expected` value."""
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        return False
    manifest = json.loads(manifest_path.read_text())
    return all(manifest.get(key) == value for key, value in expected.items())


def _is_current(root: Path) -> bool:
    expected = {"version": MANIFEST_VERSION, "seed": SEED, "profile": PROFILE, "source_digest": source_digest()}
    return manifest_matches(root, expected)


def cached_build(cache: str | None, *, is_current: Callable[[Path], bool], build: Callable[[Path], object],
                 tmp_path_factory: Any, name: str) -> Path:  # fmt: skip
    """A build in folder `cache` (rebuilt there, under a lock, unless `is_current`), else a fresh temp one."""
    if not cache:
        root = tmp_path_factory.mktemp("minibench") / name
        build(root)
        return root
    root = Path(cache)
    if is_current(root):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_current(root):
            staging = root.parent / f".{root.name}.building-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            build(staging)
            shutil.rmtree(root, ignore_errors=True)
            staging.rename(root)
    return root


def ci_minibench(tmp_path_factory) -> Path:
    return cached_build(
        os.environ.get("RSI_MINIBENCH_CACHE"),
        is_current=_is_current,
        build=lambda root: build_minibench(root, seed=SEED, profile=PROFILE),
        tmp_path_factory=tmp_path_factory,
        name=PROFILE,
    )


def trained_once(tmp_path_factory, what: dict[str, Any], train: Callable[[Path], None]) -> Path:
    """A folder ``train(folder)`` fills with checkpoints, made once per machine like the minibench.

    Kept beside ``RSI_MINIBENCH_CACHE`` (in ``<cache>.trained/``), named by a digest of ``what``
    (the recipes and data), the minibench builder's source digest (which covers the training
    core) and the training libraries' versions: changed training code, recipe or pin trains
    anew; an unchanged one (a fresh clone of the same commit, CI) reads the earlier checkpoints.
    Without the cache variable the training runs in the session's temp folder.
    """
    cache = os.environ.get("RSI_MINIBENCH_CACHE")
    if not cache:
        out = tmp_path_factory.mktemp("trained")
        train(out)
        return out
    libraries = {name: version(name) for name in ("torch", "transformers", "trl", "peft")}
    key = json.dumps({"what": what, "minibench": source_digest(), "libraries": libraries}, sort_keys=True)
    root = Path(cache + ".trained") / hashlib.sha256(key.encode()).hexdigest()[:16]
    done = root / ".complete"
    if done.is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            staging = root.parent / f".{root.name}.building-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            train(staging)
            (staging / "what.json").write_text(key, encoding="utf-8")
            (staging / ".complete").write_text("", encoding="utf-8")
            shutil.rmtree(root, ignore_errors=True)
            staging.rename(root)
    return root
