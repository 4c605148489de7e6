"""The tiny benchmark: a ~1.6M-parameter θ0, sealed synthetic tasks, a datapool catalog, references.

Pure ML (no Django). `build.build_minibench` writes the directory layout described in `build.py`;
`build_task_variants` generates the task variants for the task-environment filters (variants.py).
The package itself loads no ML stack: the web server and the agents and default workers import
the task variants through it, and only the builder (build.py, model.py, tokenizer.py) needs torch.
"""

from __future__ import annotations

from .variants import TaskVariant, build_task_variants, write_task_variants

__all__ = ["TaskVariant", "build_task_variants", "write_task_variants"]
