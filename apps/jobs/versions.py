"""What a job ran with: package versions and the code's commit, so any result can be reproduced.

Captured once per process (versions do not change under a running interpreter) and stored on
every Job row, both where it was enqueued and where it was executed: the two hosts may differ.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from django.conf import settings

# The packages whose versions change numbers: the ML stack and the job machinery itself.
PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "tokenizers",
    "safetensors",
    "datasets",
    "datasketch",
    "numpy",
    "Django",
    "celery",
    "kombu",
)


def package_versions() -> dict[str, str | None]:
    """Installed version of each package in PACKAGES (None when it is not installed)."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def code_commit(repo: Path | None = None) -> dict[str, Any]:
    """The git commit of the code and whether the tree had uncommitted changes.

    Deployed images often ship without .git, so ``RSI_CODE_COMMIT`` (set at image build) wins.
    """
    pinned = os.environ.get("RSI_CODE_COMMIT")
    if pinned:
        return {"commit": pinned, "dirty": False, "source": "env"}
    repo = repo or Path(settings.BASE_DIR)
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        # Uncommitted edits mean the commit alone does not reproduce the run; say so.
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "source": "unknown"}
    return {"commit": commit, "dirty": bool(status.strip()), "source": "git"}


@functools.cache
def versions_capture() -> dict[str, Any]:
    """Everything a reproduction needs to match, for this process (cached: it cannot change)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "code": code_commit(),
    }
