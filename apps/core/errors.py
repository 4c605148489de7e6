"""Errors services raise; one DRF exception handler maps them to JSON (STYLE.md 11)."""

from __future__ import annotations

from typing import Any


class ApplicationError(Exception):
    """A refusal an agent or person can act on: a stable ``code``, a message, optional detail."""

    status_code = 400

    def __init__(self, code: str, message: str, *, status: int | None = None, **detail: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail
        if status is not None:
            self.status_code = status


class NotFound(ApplicationError):
    status_code = 404


class PermissionDenied(ApplicationError):
    status_code = 403


class Conflict(ApplicationError):
    status_code = 409
