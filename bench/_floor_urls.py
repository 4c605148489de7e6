"""rsiweb's URLs plus ``POST /bench/floor``: one INSERT and COMMIT behind the same server (bench only)."""

from __future__ import annotations

import json

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from rsiweb.urls import handler404, handler500
from rsiweb.urls import urlpatterns as rsiweb_urlpatterns

FLOOR_TABLE = "bench_floor"
CREATE_FLOOR_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} "
    "(id bigserial PRIMARY KEY, key text NOT NULL, step bigint NOT NULL, value double precision NOT NULL, "
    "created_at timestamptz NOT NULL DEFAULT now())"
)


@csrf_exempt
def floor(request: HttpRequest) -> JsonResponse:
    """Parse the JSON body, INSERT one row and COMMIT: the least an append can do."""
    point = json.loads(request.body)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {FLOOR_TABLE} (key, step, value) VALUES (%s, %s, %s)",
            [point["key"], point["step"], point["value"]],
        )
    return JsonResponse({"logged": 1})


urlpatterns = [path("bench/floor", floor), *rsiweb_urlpatterns]
__all__ = ["handler404", "handler500", "urlpatterns"]
