"""Transient faults: the database, Redis or the broker briefly away. They answer 503, never 500.

A restart of PostgreSQL or Redis is an outage of seconds, not a bug: the caller should wait and
try again, and says so with ``Retry-After`` and a machine-readable code (``database_unavailable``,
``redis_unavailable``, ``broker_unavailable``). The one DRF exception handler (apps.core.api) and
:class:`TransientFaultMiddleware` (everything that is not DRF: pages, MCP) map them; job workers
use :data:`DB_TRANSIENT_ERRORS` to tell an outage they can wait out from a bug they cannot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis.exceptions
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from kombu.exceptions import OperationalError as BrokerOperationalError

from apps.core.errors import ApplicationError

# Django wraps psycopg's errors (a refused connection, a server that closed it, a pool timeout)
# into these two; IntegrityError and ProgrammingError stay out: retrying them cannot help.
DB_TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)
REDIS_TRANSIENT_ERRORS: tuple[type[Exception], ...] = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (*DB_TRANSIENT_ERRORS, *REDIS_TRANSIENT_ERRORS, BrokerOperationalError)


def retry_after_seconds() -> int:
    """What a 503 asks the caller to wait: ``RSI_RETRY_AFTER_SECONDS`` (default 5)."""
    return int(getattr(settings, "RSI_RETRY_AFTER_SECONDS", 5))


class ServiceUnavailable(ApplicationError):
    """A dependency is briefly away: 503 with ``Retry-After``; the same call later may succeed."""

    status_code = 503

    def __init__(self, code: str, message: str, *, retry_after: int | None = None, **detail: Any) -> None:
        self.retry_after = retry_after if retry_after is not None else retry_after_seconds()
        super().__init__(code, message, retry_after=self.retry_after, **detail)


def as_service_unavailable(exc: BaseException) -> ServiceUnavailable | None:
    """The 503 a transient fault answers, or None when ``exc`` is not one."""
    if isinstance(exc, ServiceUnavailable):
        return exc
    if isinstance(exc, TRANSIENT_ERRORS):
        return service_unavailable_for(exc)
    return None


def service_unavailable_for(exc: BaseException) -> ServiceUnavailable:
    """The 503 for one of :data:`TRANSIENT_ERRORS`, its code naming what is away."""
    if isinstance(exc, DB_TRANSIENT_ERRORS):
        return ServiceUnavailable("database_unavailable", "The database is briefly unavailable; retry shortly.")
    if isinstance(exc, REDIS_TRANSIENT_ERRORS):
        return ServiceUnavailable("redis_unavailable", "Redis is briefly unavailable; retry shortly.")
    if isinstance(exc, BrokerOperationalError):
        # Raised after commit when a task message could not be sent: the change is recorded (a
        # retry with the same Idempotency-Key is answered from it) and the reapers re-send.
        return ServiceUnavailable("broker_unavailable", "The task broker is briefly unavailable; retry shortly.")
    return ServiceUnavailable("service_unavailable", f"A dependency is briefly unavailable ({type(exc).__name__}).")


class TransientFaultMiddleware:
    """503 instead of Django's 500 page for a transient fault in a view outside DRF (DRF maps its own)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        fault = as_service_unavailable(exception)
        if fault is None:
            return None
        body = {"error": {"code": fault.code, "message": fault.message, "detail": fault.detail}}
        response = JsonResponse(body, status=503)
        response["Retry-After"] = str(fault.retry_after)
        return response
