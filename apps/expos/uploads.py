"""POST /api/v1/tools/worker_add_data/upload: a file of agent-made data streamed as the request body.

``worker_add_data`` takes data an agent made inline (``content``, at most
apps.expos.tools.data.MAX_UPLOAD_CHARS characters in a JSON body of RSI_MAX_REQUEST_BYTES). A larger
file is sent here instead: the body is the file's bytes (``Content-Length`` or chunked), the
tool's other arguments (``sha256``, ``size_bytes``, ``generator``, and optionally ``name``,
``format``, ``teacher``, ``note``) are query parameters, and the call is otherwise the tool's own
(ToolCallView): the same token, role, Idempotency-Key, recording, refusals and answer.

The body is streamed to a private staging file and hashed as it arrives, not buffered in memory;
a body whose length or digest is not the declared one is refused (``size_mismatch``,
``sha256_mismatch``) before any replay or registration, and the staging file is removed whatever
the outcome. Only then does the tool run, on the staged file: the registration every upload takes
(apps.datapool.services.data_register_upload: validation, the run's limits, the contamination
review against the sealed items, the content-addressed store). So a retry of the same bytes is
safe: with the same Idempotency-Key it replays the answer, without one identical bytes answer the
entry they already made.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from django.http import HttpRequest, HttpResponseBase
from drf_spectacular.utils import extend_schema

from apps.core.errors import ApplicationError, NotFound
from apps.core.middleware import CHUNKED_STREAM_KEY
from apps.datapool.services import upload_limits
from apps.expos.registry import STREAMED_FILE, Tool, ToolContext
from apps.expos.views import ToolCallView

_CHUNK = 1 << 20


def _query_arguments(request: HttpRequest) -> dict[str, Any]:
    """The query string as the tool's arguments: one value each; size_bytes a whole number."""
    args: dict[str, Any] = {}
    for key in request.GET:
        values = request.GET.getlist(key)
        if len(values) != 1:
            raise ApplicationError("invalid_input", f"Give {key} once, not {len(values)} times.", path=f"/{key}")
        args[key] = values[0]
    size = args.get("size_bytes")
    if isinstance(size, str) and size.isdigit() and len(size) < 19:
        args["size_bytes"] = int(size)
    return args


@extend_schema(exclude=True)  # documented by apps.expos.openapi.postprocess (upload_operation)
class ToolUploadView(ToolCallView):
    """A tool (worker_add_data) with its file as the streamed body (the module's docstring)."""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        self._staging: list[Path] = []  # removed whatever the call's outcome
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            for folder in self._staging:
                shutil.rmtree(folder, ignore_errors=True)

    def _parse(self, request: HttpRequest, tool: Tool) -> tuple[Any, bool, Tool]:
        if tool.stream_schema is None:
            raise NotFound("no_upload", f"{tool.name} takes no streamed upload; POST its arguments as JSON.")
        return (
            _query_arguments(request),
            False,
            replace(tool, name=f"{tool.name}/upload", input_schema=tool.stream_schema),
        )

    def _receive(self, request: HttpRequest, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> None:
        declared_size, declared_sha = args["size_bytes"], args["sha256"]
        max_bytes, _, _ = upload_limits(ctx.run)
        if declared_size > max_bytes:
            raise ApplicationError(
                "file_too_large",
                f"size_bytes is {declared_size}; this run takes at most {max_bytes} bytes per upload "
                "(its policy's upload_max_bytes). Nothing was read or registered; split the file.",
                status=413,
                size=declared_size,
                max_bytes=max_bytes,
            )
        stream: Any = request.META.get(CHUNKED_STREAM_KEY)
        if stream is None:
            length = request.META.get("CONTENT_LENGTH") or ""
            if not length.isdigit():
                raise ApplicationError(
                    "length_required", "Send the file with a Content-Length header (or chunked).", status=411
                )
            if int(length) != declared_size:
                raise ApplicationError(
                    "size_mismatch",
                    f"size_bytes declares {declared_size} bytes but Content-Length is {length}; nothing was "
                    "read or registered.",
                    declared=declared_size,
                    received=int(length),
                )
            stream = request  # Django's stream, bounded by Content-Length
        self._staging.append(Path(tempfile.mkdtemp(prefix="rsi-upload-")))
        target = self._staging[-1] / "upload.jsonl"
        digest, size = hashlib.sha256(), 0
        with target.open("wb") as sink:
            while True:
                # One byte past the declared size is enough to know the body is longer.
                chunk = stream.read(min(_CHUNK, declared_size + 1 - size))
                if not chunk:
                    break
                size += len(chunk)
                digest.update(chunk)
                sink.write(chunk)
                if size > declared_size:
                    break
        if size != declared_size:
            more = " or more" if size > declared_size else ""
            raise ApplicationError(
                "size_mismatch",
                f"size_bytes declares {declared_size} bytes but {size}{more} arrived; nothing was registered. "
                "Send the whole file again (the same Idempotency-Key is safe to reuse).",
                declared=declared_size,
                received=size,
            )
        actual = digest.hexdigest()
        if actual != declared_sha:
            raise ApplicationError(
                "sha256_mismatch",
                f"sha256 declares {declared_sha} but the bytes that arrived hash to {actual}; nothing was "
                "registered. Hash the file you send (sha256sum) and send it again.",
                declared=declared_sha,
                received=actual,
            )
        ctx.extra[STREAMED_FILE] = target
