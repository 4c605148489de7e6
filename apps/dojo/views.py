"""Agent-evaluation suites for people, included under /api/v1/suites/.

    GET  /api/v1/suites/                      the suites (viewer+)
    POST /api/v1/suites/                      create one, and launch it unless ``"launch": false`` (operator+)
    GET  /api/v1/suites/<uuid>/               the suite, its cells and statistics (viewer+);
                                              ``?format=csv[&table=cells|agents]`` exports a table as CSV,
                                              ``?format=json`` the whole statistics
    POST /api/v1/suites/<uuid>/launch         start a created suite (operator+)

Session users only, like the integrity endpoints: a suite is an operator's experiment on agents,
not an agent's to read or start. Refusals are JSON with a stable ``code`` (apps.core.api).
"""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.parsers import JSONParser
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.errors import ApplicationError, NotFound
from apps.core.people import is_human_operator, is_human_viewer
from apps.dojo.models import AgentSuite
from apps.dojo.suite_stats import stats_csv, suite_stats
from apps.dojo.suites import cell_status, suite_create, suite_launch

SUITE_LIST_LIMIT = 200


class IsViewerReadsOperatorWrites(BasePermission):
    message = "Sign in as a viewer to read suites, and as an operator or admin to create or launch one."

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            return is_human_viewer(request.user)
        return is_human_operator(request.user)


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return data.encode("utf-8") if isinstance(data, str) else str(data).encode("utf-8")


class SuiteInput(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=200)
    agents = serializers.ListField(child=serializers.CharField(max_length=64), min_length=1, max_length=10)
    tasks = serializers.ListField(child=serializers.CharField(max_length=200), min_length=1, max_length=50)
    base_models = serializers.ListField(child=serializers.CharField(max_length=200), required=False, max_length=10)
    train_tasks = serializers.ListField(child=serializers.CharField(max_length=1000), required=False, max_length=50)
    budget = serializers.DictField(required=False)
    seeds = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=2_000_000_000),
        required=False,
        min_length=1,
        max_length=20,
        help_text="run seeds: every cell once per seed",
    )
    max_concurrent = serializers.IntegerField(required=False, min_value=1, max_value=32)
    llm_profile = serializers.CharField(required=False, max_length=64)
    launch = serializers.BooleanField(required=False, default=True)


def suite_summary(suite: AgentSuite) -> dict[str, Any]:
    statuses = [cell_status(s) for s in suite.cells.values_list("run__status", flat=True)]
    return {
        "uuid": str(suite.uuid),
        "name": suite.name,
        "status": suite.status,
        "agents": suite.agents,
        "budget": suite.budget,
        "seeds": suite.seeds,
        "max_concurrent": suite.max_concurrent,
        "train_tasks": suite.train_tasks,
        "cells": {s: statuses.count(s) for s in ("queued", "running", "ended")},
        "created_at": suite.created_at.isoformat(),
        "started_at": suite.started_at.isoformat() if suite.started_at else None,
        "finished_at": suite.finished_at.isoformat() if suite.finished_at else None,
    }


def suite_by_uuid(value: str) -> AgentSuite:
    try:
        key = uuid.UUID(value)
    except ValueError:
        raise NotFound("suite_not_found", f"No suite {value}.") from None
    found = AgentSuite.objects.filter(uuid=key).first()
    if found is None:
        raise NotFound("suite_not_found", f"No suite {value}.")
    return found


def _actor(request: Request) -> str:
    return f"user:{request.user.get_username()}"


class SuiteListView(APIView):
    authentication_classes = [SessionAuthentication]
    permission_classes = [IsViewerReadsOperatorWrites]
    parser_classes = [JSONParser]  # a JSON body, as documented (a form body could arrive chunked: 411)

    @extend_schema(responses={200: dict}, operation_id="suites_list")
    def get(self, request: Request) -> Response:
        suites = AgentSuite.objects.order_by("-created_at", "-pk")[:SUITE_LIST_LIMIT]
        return Response({"results": [suite_summary(s) for s in suites]})

    @extend_schema(request=SuiteInput, responses={201: dict}, operation_id="suites_create")
    def post(self, request: Request) -> Response:
        data = SuiteInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        launch = values.pop("launch", True)
        suite = suite_create(**values, created_by=request.user, actor=_actor(request))
        if launch:
            suite = suite_launch(suite=suite, actor=_actor(request))
        return Response(suite_summary(suite), status=201)


class SuiteDetailView(APIView):
    authentication_classes = [SessionAuthentication]
    permission_classes = [IsViewerReadsOperatorWrites]
    renderer_classes = [JSONRenderer, CSVRenderer, BrowsableAPIRenderer]

    def handle_exception(self, exc: Exception) -> Response:
        # A refusal is JSON whatever the export format asked for (agents and scripts parse it).
        response = super().handle_exception(exc)
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response

    @extend_schema(
        responses={200: dict, (200, "text/csv"): OpenApiTypes.STR},
        parameters=[
            OpenApiParameter("format", str, enum=["json", "csv"], description="csv exports one table"),
            OpenApiParameter("table", str, enum=["cells", "agents"], description="the CSV table (default cells)"),
        ],
        operation_id="suites_retrieve",
    )
    def get(self, request: Request, suite_uuid: str) -> Response:
        suite = suite_by_uuid(suite_uuid)
        stats = suite_stats(suite)
        if request.accepted_renderer.format == "csv":
            table = request.query_params.get("table", "cells")
            if table not in ("cells", "agents"):
                raise ApplicationError("invalid_table", f"table is 'cells' or 'agents', not {table!r}.")
            response = Response(stats_csv(stats, table=table), content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = f'attachment; filename="suite-{suite.uuid}-{table}.csv"'
            return response
        return Response({**suite_summary(suite), "overlap": suite.overlap, "stats": stats})


class SuiteLaunchView(APIView):
    authentication_classes = [SessionAuthentication]
    permission_classes = [IsViewerReadsOperatorWrites]

    @extend_schema(
        request=None,
        responses={200: dict, 409: OpenApiResponse(description="suite_not_created: the suite was launched before")},
        operation_id="suites_launch",
    )
    def post(self, request: Request, suite_uuid: str) -> Response:
        suite = suite_launch(suite=suite_by_uuid(suite_uuid), actor=_actor(request))
        return Response(suite_summary(suite))
