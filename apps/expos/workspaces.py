"""Worker workspaces: the one folder per Worker where discovery downloads land before registration.

``settings.WORKSPACE_ROOT/<run uuid>/<node handle>/``, created on first use. Only Workers have
one: they are the only role that registers data (``worker_add_data``), and data found outside
enters training only through that tool, which copies the file into the content-addressed
datapool. Nothing in a workspace is ever read by training or evaluation directly.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from apps.core.errors import ApplicationError, PermissionDenied
from apps.research.choices import NodeKind
from apps.research.models import ResearchNode, Run


def workspace_root() -> Path:
    return Path(settings.WORKSPACE_ROOT).resolve()


def workspace_path(*, run: Run, node: ResearchNode, create: bool = True) -> Path:
    """The calling Worker's workspace folder (created on demand unless ``create`` is false)."""
    if node.kind != NodeKind.WORKER:
        raise PermissionDenied(
            "no_workspace", f"{node.handle} is a {node.kind}; only Workers have a workspace for data files."
        )
    if node.run_id != run.pk:
        raise PermissionDenied("foreign_node", f"{node.handle} does not belong to run {run.uuid}.")
    # Handles are generated (worker_0003) and the uuid is ours, so neither can contain a separator;
    # the check below guards against a corrupt row all the same.
    path = (workspace_root() / str(run.uuid) / node.handle).resolve()
    if path.parent.parent != workspace_root():
        raise ApplicationError("invalid_workspace", f"workspace of {node.handle} would leave the workspace root")
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
