"""Canonical JSON and sha256 helpers shared by the event chain, manifests and the datapool."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def canonical_json(value: Any) -> str:
    """One byte-exact serialisation of a JSON value, so hashes do not depend on key order."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_text(text: str) -> str:
    # surrogatepass: a lone surrogate (valid in a Python str, not in UTF-8) hashes instead of
    # raising, so hashing a refused request never crashes; valid text hashes as plain UTF-8.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_tree(root: Path) -> dict[str, str]:
    """sha256 of every regular file under ``root``, keyed by its POSIX path relative to root."""
    return {path.relative_to(root).as_posix(): sha256_file(path) for path in sorted(root.rglob("*")) if path.is_file()}
