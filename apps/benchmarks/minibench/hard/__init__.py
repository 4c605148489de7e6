"""The minibench `hard` profile: one arithmetic benchmark whose catalog carries realistic traps.

A subpackage on purpose: ``build.source_digest`` hashes only the ``*.py`` files directly in the
minibench package, so nothing here changes the `ci` and `full` digests or their caches. The hard
profile has its own digest (``hard_source_digest``), which covers the base builder's too.
"""

from __future__ import annotations

from .build import HARD_SIZES, NAMESPACE, build_hard, hard_source_digest

__all__ = ["HARD_SIZES", "NAMESPACE", "build_hard", "hard_source_digest"]
