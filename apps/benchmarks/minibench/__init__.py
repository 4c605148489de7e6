"""The tiny benchmark: a ~1.6M-parameter θ0, sealed synthetic tasks, a datapool catalog, references.

Pure ML (no Django). `build_minibench` writes the directory layout described in `build.py`;
`build_task_variants` generates the task variants for the task-environment filters (variants.py).
"""

from __future__ import annotations

from .build import build_minibench
from .variants import TaskVariant, build_task_variants, write_task_variants

__all__ = ["TaskVariant", "build_minibench", "build_task_variants", "write_task_variants"]
