"""Request hygiene before any view runs: a chunked body is read, or the request is refused.

A body sent with ``Transfer-Encoding: chunked`` has no Content-Length, and Django reads a WSGI
body only up to CONTENT_LENGTH (``LimitedStream``): under a2wsgi (rsiweb/asgi.py) such a body
read as empty and a tool ran with ``{}``. The server decodes the chunks (uvicorn, gunicorn), so
this middleware reads the decoded stream itself, at most the upload limit, and hands Django a
body of known length. A server that cannot pass the body on (Django's development server wraps
the input in a zero-length LimitedStream) gets 411: never a request that silently lost its body.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest, HttpResponse, JsonResponse

from apps.core.api import error_body

# Views that stream a chunked body themselves, with a limit of their own (an agent's data file,
# apps.expos.uploads): the decoded stream is left to them under this META key, not read here.
STREAMED_BODY_PATH = re.compile(r"^/api/v1/tools/[^/]+/upload$")
CHUNKED_STREAM_KEY = "rsi.chunked_stream"


def _refusal(code: str, message: str, status: int) -> HttpResponse:
    return JsonResponse(error_body(code, message), status=status)


class ChunkedBodyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        coding = request.META.get("HTTP_TRANSFER_ENCODING", "")
        if coding and not request.META.get("CONTENT_LENGTH"):
            refusal = self._read_chunked(request, coding)
            if refusal is not None:
                return refusal
        return self.get_response(request)

    def _read_chunked(self, request: HttpRequest, coding: str) -> HttpResponse | None:
        codings = [part.strip().lower() for part in coding.split(",") if part.strip()]
        if codings != ["chunked"]:
            return _refusal(
                "unsupported_transfer_coding", f"Transfer-Encoding {coding!r} is not supported; send chunked.", 501
            )
        stream: Any = request.META.get("wsgi.input")
        if stream is None or isinstance(stream, LimitedStream):
            return _refusal(
                "length_required",
                "This server cannot read a chunked request body; send it with a Content-Length header.",
                411,
            )
        if STREAMED_BODY_PATH.match(request.path_info):
            request.META[CHUNKED_STREAM_KEY] = stream
            return None
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        body = stream.read(limit + 1) if limit is not None else stream.read()
        if limit is not None and len(body) > limit:
            return _refusal(
                "request_too_large", "The request body exceeds the size limit (RSI_MAX_REQUEST_BYTES).", 413
            )
        # From here on the request is one of known length, as if Content-Length had been sent.
        request.META["CONTENT_LENGTH"] = str(len(body))
        request._stream = io.BytesIO(body)
        return None
