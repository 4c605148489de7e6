"""Transient faults map to 503 with Retry-After and a code, in the API's one error shape."""

from __future__ import annotations

import redis.exceptions
from django.db import IntegrityError, OperationalError
from kombu.exceptions import OperationalError as BrokerOperationalError

from apps.core.api import exception_handler
from apps.core.transient import TransientFaultMiddleware


def test_database_redis_and_broker_faults_answer_503_with_retry_after_and_their_code(settings):
    settings.RSI_RETRY_AFTER_SECONDS = 7
    for exc, code in [
        (OperationalError("connection to server at 127.0.0.1 failed: Connection refused"), "database_unavailable"),
        (redis.exceptions.ConnectionError("Error 111 connecting"), "redis_unavailable"),
        (redis.exceptions.TimeoutError("Timeout reading"), "redis_unavailable"),
        (BrokerOperationalError("Error 111 connecting to 127.0.0.1:6379"), "broker_unavailable"),
    ]:
        response = exception_handler(exc, {})
        assert response is not None
        assert response.status_code == 503, code
        assert response["Retry-After"] == "7"
        assert response.data["error"]["code"] == code
        assert response.data["error"]["detail"] == {"retry_after": 7}


def test_a_refused_write_is_still_a_conflict_not_an_outage():
    response = exception_handler(IntegrityError("duplicate key"), {})
    assert response is not None
    assert response.status_code == 409


def test_pages_outside_drf_answer_503_too(rf):
    middleware = TransientFaultMiddleware(lambda request: None)  # type: ignore[arg-type, return-value]
    response = middleware.process_exception(rf.get("/runs/"), OperationalError("server closed the connection"))
    assert response is not None
    assert response.status_code == 503
    assert int(response["Retry-After"]) > 0
    assert middleware.process_exception(rf.get("/runs/"), ValueError("a bug")) is None
