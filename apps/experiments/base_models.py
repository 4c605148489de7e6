"""Register any local Hugging Face causal LM as a θ0 (base) or a reference checkpoint.

`manage.py model_add <folder | owner/name> --role base|reference` (and the README's "Real
benchmarks"). The model is checked and profiled by `apps.ml.base_models` (safetensors only, no
remote code, a causal LM; family, chat template and EOS handling recorded on the checkpoint as
``model_profile``), copied with its sha256 manifest (a base into the artifact store, where
Workers' jobs read it; a reference under SEALED_ROOT, where only evaluation workers do), and
registered. Idempotent per handle: the same files again change nothing, other files are refused.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.core.errors import ApplicationError
from apps.core.files import copy_tree_once
from apps.datapool.storage import artifact_store, checkpoint_key
from apps.experiments.models import Checkpoint
from apps.experiments.services import checkpoint_register_once
from apps.ml.base_models import ModelRefused, model_profile, resolve_model

ROLES = ("base", "reference")


def _stage(directory: Path, target: Path, chat_template: str | None) -> None:
    # Hub cache snapshots are symlinks into a blob store: copy the files they point to.
    shutil.copytree(directory, target, symlinks=False, ignore=shutil.ignore_patterns(".cache", ".git"))
    if chat_template is not None:
        (target / "chat_template.jinja").write_text(chat_template, encoding="utf-8")


def _seal(directory: Path, digest: str) -> str:
    """A write-once, content-addressed copy under SEALED_ROOT/models; its file:// URI."""
    return copy_tree_once(directory, Path(settings.SEALED_ROOT).resolve() / "models" / digest).as_uri()


def model_register(
    *, source: str, role: str, handle: str, chat_template_file: Path | None = None
) -> tuple[Checkpoint, bool]:
    """Register `source` (a folder or a cached hub id) as a base or reference checkpoint `handle`.

    Returns the checkpoint and whether it was created. A pinned chat template (PostTrainBench pins
    one per family) is written as the checkpoint's chat_template.jinja, and the tokenizer must then
    load exactly that template, or the registration is refused.
    """
    if role not in ROLES:
        raise ApplicationError("invalid_role", f"role must be one of {ROLES}, got {role!r}")
    if not handle or len(handle) > 64:
        raise ApplicationError("invalid_handle", "Give a handle of 1-64 characters, e.g. qwen3-1.7b-base.")
    template = None
    if chat_template_file is not None:
        try:
            template = Path(chat_template_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ApplicationError("chat_template_unreadable", f"{chat_template_file}: {exc}") from None
    try:
        directory = resolve_model(source)
    except ModelRefused as exc:
        raise ApplicationError("model_not_found", str(exc), status=404) from None
    with tempfile.TemporaryDirectory(prefix="rsi-model-") as scratch:
        staged = Path(scratch) / "model"
        _stage(directory, staged, template)
        try:
            profile: dict[str, Any] = model_profile(staged, name=source, chat_template=template)
        except (ModelRefused, OSError, ValueError) as exc:
            raise ApplicationError("model_refused", str(exc)) from None
        if template is not None:
            from transformers import AutoTokenizer  # noqa: PLC0415 - only a pinned template needs a reload

            loaded = AutoTokenizer.from_pretrained(staged, trust_remote_code=False, local_files_only=True)
            if loaded.chat_template != template:
                raise ApplicationError(
                    "chat_template_not_loaded",
                    f"{source}: the tokenizer does not load the pinned template from chat_template.jinja "
                    "(its tokenizer_config.json sets another); remove that key from a local copy and register it",
                )
        return checkpoint_register_once(
            handle=handle,
            directory=staged,
            store=lambda digest: (
                artifact_store().put_dir(staged, key=checkpoint_key(digest))
                if role == "base"
                else _seal(staged, digest)
            ),
            remedy="choose another handle",
            is_base=role == "base",
            is_reference=role == "reference",
            model_profile=profile,
        )
