"""The one DRF exception handler: every error is JSON with a stable code and a message."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from apps.core.errors import ApplicationError
from apps.core.transient import as_service_unavailable


def error_body(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": {"code": code, "message": message}}
    if detail:
        body["error"]["detail"] = detail
    return body


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    fault = as_service_unavailable(exc)
    if fault is not None:
        # The database or Redis briefly away: the same call may succeed in a few seconds.
        unavailable = Response(error_body(fault.code, fault.message, fault.detail), status=503)
        unavailable["Retry-After"] = str(fault.retry_after)
        return unavailable
    if isinstance(exc, ApplicationError):
        return Response(error_body(exc.code, exc.message, exc.detail or None), status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        return Response(error_body("invalid", "The input failed validation.", detail), status=400)
    if isinstance(exc, IntegrityError):
        # A database constraint refused the write: a race or a duplicate, never a server fault.
        return Response(error_body("conflict", f"The database refused the change: {exc}"), status=409)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = getattr(exc, "default_code", "error")
    if isinstance(exc, exceptions.ValidationError):
        response.data = error_body("invalid", "The input failed validation.", response.data)
    else:
        message = response.data.get("detail", str(exc)) if isinstance(response.data, dict) else str(exc)
        response.data = error_body(str(code), str(message))
    if response.status_code >= status.HTTP_500_INTERNAL_SERVER_ERROR:
        return None
    return response
