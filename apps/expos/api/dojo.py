"""RSI-Dojo endpoints for operators.

    POST /api/v1/dojo/trajectory-exports   {"runs": [uuid...] | "all_finished": true, "filters": [...], "name": str,
                                            "tokenizer": checkpoint handle (optional)}

Exports recorded transcripts as a datapool entry of format ``chat`` (apps.dojo.export) with the
tool registry's schemas as its tools column. Session users in the operator group only: agents
never export (or see) trajectories.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.errors import ApplicationError, NotFound
from apps.core.people import is_human_operator
from apps.dojo.export import checkpoint_chat_tokenizer, finished_runs, trajectory_export
from apps.expos.api.serializers import DataEntrySerializer
from apps.expos.registry import tools_for_role
from apps.research.models import Run


def tool_definitions(role: str) -> list[dict[str, Any]]:
    """The registry's OpenAI-style definitions of one role's tools (what an agent of that role is given)."""
    return [tool.definition() for tool in tools_for_role(role)]


def runs_by_uuid(values: list[str]) -> list[Run]:
    """Runs in the order named; a 404 names every uuid that is no run."""
    found = {str(r.uuid): r for r in Run.objects.filter(uuid__in=values)}
    missing = [v for v in values if v not in found]
    if missing:
        raise NotFound("run_not_found", f"No run {', '.join(missing)}.")
    return [found[v] for v in values]


class IsOperator(BasePermission):
    message = "Exporting trajectories needs the operator or admin group."

    def has_permission(self, request: Request, view: Any) -> bool:
        return is_human_operator(request.user)


class TrajectoryExportInput(serializers.Serializer[dict[str, Any]]):
    runs = serializers.ListField(child=serializers.UUIDField(), required=False, max_length=1000)
    all_finished = serializers.BooleanField(required=False, default=False)
    filters = serializers.ListField(
        child=serializers.CharField(max_length=100), required=False, allow_null=True, default=None,
        help_text="Detector names (name or name@version), or all, none, behaviour, outcome. Default: all.",
    )  # fmt: skip
    name = serializers.CharField(max_length=200, required=False, default="trajectories")
    tokenizer = serializers.CharField(
        max_length=64, required=False, allow_null=True, default=None,
        help_text="A registered checkpoint's handle (e.g. theta0), never a path: each row states its token count "
        "rendered with that checkpoint's tokenizer and chat template (report.tokens); none when left out.",
    )  # fmt: skip

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if bool(attrs.get("runs")) == bool(attrs.get("all_finished")):
            raise serializers.ValidationError("Give either runs (a list of run uuids) or all_finished: true.")
        return attrs


class TrajectoryExportOutput(serializers.Serializer[dict[str, Any]]):
    entry = DataEntrySerializer()
    report = serializers.DictField()


class TrajectoryExportView(APIView):
    """Export runs' transcripts (every node, Reviewers screened; one conversation per compaction segment)."""

    authentication_classes = [SessionAuthentication]
    permission_classes = [IsOperator]
    parser_classes = [JSONParser]  # a JSON body, as documented (a form body could arrive chunked: 411)

    @extend_schema(
        request=TrajectoryExportInput,
        # 400 (bad input, an unknown filter, a run not ended, nothing to export, a checkpoint without a chat
        # tokenizer), 403 (not an operator) and 404 (no such run or checkpoint) get the Error body from
        # apps.expos.openapi.postprocess.
        responses={
            201: TrajectoryExportOutput,
            411: OpenApiResponse(description="length_required: a chunked body; send Content-Length."),
            413: OpenApiResponse(description="request_too_large: the body exceeds RSI_MAX_REQUEST_BYTES."),
            409: OpenApiResponse(
                description="contains_sealed_items or contamination_unverifiable: the contamination scan refused "
                "the data; checkpoint_files_changed: the named tokenizer's files differ from its checkpoint's "
                "manifest; nothing was registered."
            ),
        },
        operation_id="dojo_trajectory_export",
    )
    def post(self, request: Request) -> Response:
        data = TrajectoryExportInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        runs = runs_by_uuid([str(u) for u in values["runs"]]) if values.get("runs") else finished_runs()
        if not runs:
            raise ApplicationError("no_runs", "There is no finished run to export yet.")
        tokenizer = checkpoint_chat_tokenizer(handle=values["tokenizer"]) if values.get("tokenizer") else None
        result = trajectory_export(
            runs=runs, name=values["name"], filters=values["filters"], tool_definitions=tool_definitions,
            tokenizer=tokenizer, actor=f"user:{request.user.get_username()}",
        )  # fmt: skip
        return Response({"entry": DataEntrySerializer(result.entry).data, "report": result.report}, status=201)
