"""Register a local Hugging Face causal LM (a folder or a cached hub id) as θ0 or a reference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.core.errors import ApplicationError
from apps.experiments.base_models import ROLES, model_register


class Command(BaseCommand):
    help = (
        "Register a causal LM as a base (θ0) or reference checkpoint: checked (safetensors, no remote code), "
        "hashed, copied, with its family, chat template and EOS handling recorded. Never downloads."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("source", help="a model folder, or a hub id (owner/name) already in the local HF cache")
        parser.add_argument("--handle", required=True, help="the checkpoint's handle, e.g. qwen3-1.7b-base")
        parser.add_argument("--role", choices=ROLES, default="base")
        parser.add_argument("--chat-template", type=Path, help="a pinned chat template (.jinja) replacing the model's")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            checkpoint, created = model_register(
                source=options["source"],
                role=options["role"],
                handle=options["handle"],
                chat_template_file=options["chat_template"],
            )
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        self.stdout.write(
            json.dumps(
                {
                    "handle": checkpoint.handle,
                    "created": created,
                    "uri": checkpoint.uri,
                    "manifest_sha256": checkpoint.manifest_sha256,
                    "model_profile": checkpoint.model_profile,
                },
                indent=2,
            )
        )
