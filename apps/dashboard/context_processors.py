"""Template context every page gets."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from apps.benchmarks.build_progress import READY, build_progress_read


def minibench_build(request: HttpRequest) -> dict[str, Any]:
    """The minibench build's progress while one is on (or failed), for the bar at the top of every page."""
    progress = build_progress_read()
    return {"minibench_build": progress if progress and progress["state"] != READY else None}
