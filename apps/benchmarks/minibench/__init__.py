"""The tiny benchmark: a ~1M-parameter θ0, sealed synthetic tasks, a datapool catalog, references.

Pure ML (no Django). `build_minibench` writes the directory layout described in `build.py`.
"""

from __future__ import annotations

from .build import build_minibench

__all__ = ["build_minibench"]
