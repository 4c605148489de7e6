"""File operations shared by the places that seal content-addressed copies."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path


def copy_tree_once(directory: Path, target: Path) -> Path:
    """Copy ``directory`` to ``target`` unless it is there already; write-once and atomic.

    ``target`` is named by its content's digest, so a folder already there is the same content:
    the copy goes to a hidden partial folder first and is renamed into place, and a concurrent
    copier that got there first wins without an error.
    """
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.partial"
        try:
            shutil.copytree(directory, tmp)
            tmp.rename(target)
        except OSError:
            if not target.exists():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
