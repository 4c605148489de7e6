"""Read-only resource endpoints for the UI, people and agents: runs, nodes, experiments (with
lineage), checkpoints, datapool entries, evaluations (with per-sample rows), reports and events.

Querysets come from apps.expos.visibility, so an agent token sees exactly what its role may see
and a person (viewer+) sees everything. A denied read of sealed material is recorded.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from apps.core.errors import ApplicationError
from apps.datapool.models import DataEntry
from apps.experiments.models import Checkpoint, Evaluation, EvaluationSample, Event, Experiment
from apps.expos.api import filters, serializers
from apps.expos.auth import AgentTokenAuthentication, AgentTokenRateThrottle, IsAgentOrViewer, agent_token_of
from apps.expos.registry import ToolContext
from apps.expos.selectors import lineage_payload, parse_uuid
from apps.expos.visibility import (
    Caller,
    HumanCaller,
    SealedAccessDenied,
    evaluation_read_check,
    is_agent,
    samples_read_check,
    sealed_denial_record,
    transcript_read_check,
    visible_checkpoints,
    visible_datapool,
    visible_evaluations,
    visible_events,
    visible_experiments,
    visible_nodes,
    visible_reports,
    visible_runs,
)
from apps.flows.scores import run_leaderboard, run_scores
from apps.research.models import ResearchEdge, ResearchNode, Run
from apps.research.transcripts import node_turns
from apps.reviews.models import ReviewReport

logger = logging.getLogger(__name__)
TRANSCRIPT_PAGE = 200  # turns per transcript page
UUID_PATH = r"[^/]+"  # a malformed uuid reaches the view and gets a JSON 404, not the HTML one


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """LimitOffset with a ceiling on both numbers, so no query string can make the database fail.

    Strict, as documented: a limit or offset that is not a whole number in range is a 400 naming
    it (DRF's own pagination would quietly use its default instead).
    """

    max_limit = 1000
    max_offset = 10**12
    limit_query_description = (
        f"Number of results to return per page (1 or more; at most {max_limit}, more is lowered to it)."
    )
    offset_query_description = "The initial index from which to return the results (0 or more)."

    def _whole(self, request: Request, name: str, minimum: int, maximum: int | None) -> int | None:
        values = request.query_params.getlist(name)
        if not values:
            return None
        try:
            number = int(values[-1], 10)
        except ValueError:
            number = None
        if number is None or number < minimum or (maximum is not None and number > maximum):
            bound = f"{minimum} to {maximum}" if maximum is not None else f"{minimum} or more"
            raise ApplicationError("invalid", f"{name} must be a whole number, {bound}.", parameter=name)
        return number

    def get_limit(self, request: Request) -> int | None:
        limit = self._whole(request, self.limit_query_param, 1, None)
        return self.default_limit if limit is None else min(limit, self.max_limit)

    def get_offset(self, request: Request) -> int:
        return min(self._whole(request, self.offset_query_param, 0, None) or 0, self.max_offset)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: {"minimum": 1}, self.offset_query_param: {"minimum": 0}}
        for parameter in parameters:
            parameter["schema"] = {**parameter.get("schema", {}), **bounds.get(parameter["name"], {})}
        return parameters


class _WithoutFormatOverride:
    """DRF's settings with no ``?format=`` override: content is negotiated by the Accept header."""

    URL_FORMAT_OVERRIDE = None

    def __getattr__(self, name: str) -> Any:
        return getattr(api_settings, name)


class AcceptOnlyNegotiation(DefaultContentNegotiation):
    """``?format=`` is the datapool's filter (sft, dpo...), never a renderer choice."""

    settings = _WithoutFormatOverride()  # type: ignore[assignment]  # DRF's settings, less one


def caller_of(request: Request) -> Caller:
    """The agent (as a ToolContext) or person behind a request; cached on the request."""
    cached = getattr(request, "_expos_caller", None)
    if cached is not None:
        return cached
    token = agent_token_of(request)
    caller: Caller
    if token is not None:
        caller = ToolContext(run=token.run, node=token.node, role=token.role, token=token)
    else:
        caller = HumanCaller(user=request.user)
    request._expos_caller = caller  # type: ignore[attr-defined]
    return caller


class ScopedReadViewSet(viewsets.ReadOnlyModelViewSet):
    """Base of every resource endpoint: agent token or viewer session, scoped querysets, JSON errors."""

    authentication_classes = [AgentTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAgentOrViewer]
    throttle_classes = [AgentTokenRateThrottle]
    pagination_class = BoundedLimitOffsetPagination
    lookup_field = "uuid"
    lookup_value_regex = UUID_PATH
    model: type[Any]

    def scoped(self, caller: Caller) -> QuerySet[Any]:
        raise NotImplementedError

    def get_queryset(self) -> QuerySet[Any]:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no caller
            return self.model.objects.none()
        return self.scoped(caller_of(self.request))

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        if not getattr(self, "swagger_fake_view", False):
            context["caller"] = caller_of(self.request)
        return context

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, SealedAccessDenied):
            # No transaction wraps a read request, so the record commits even though we refuse.
            try:
                sealed_denial_record(exc)
            except Exception:  # the refusal must still reach the caller
                logger.exception("could not record a denied sealed read")
        return super().handle_exception(exc)


class RunViewSet(ScopedReadViewSet):
    model = Run
    serializer_class = serializers.RunSerializer
    filterset_class = filters.RunFilter

    def scoped(self, caller: Caller) -> QuerySet[Run]:
        return visible_runs(caller).select_related("benchmark", "base_checkpoint").order_by("-created_at", "-pk")

    @extend_schema(
        responses={
            200: {
                "type": "object",
                "properties": {"scores": {"type": "object"}, "leaderboard": {"type": "object"}},
                "required": ["scores", "leaderboard"],
            }
        },
        filters=False,
    )
    @action(detail=True, methods=["get"], filterset_class=None, pagination_class=None)
    def scores(self, request: Request, uuid: str | None = None) -> Response:
        """The run's final-split scores (raw, θ0, reference with CIs, Lite gain, integrity counts) and its
        PostTrainBench cell under both readings with the benchmark's published weight; people only."""
        run = self.get_object()
        caller = caller_of(request)
        if is_agent(caller):
            raise SealedAccessDenied(
                caller,
                what=f"the final-split scores of run {run.uuid}",
                tool=f"GET {request.path}",
                request={"run": str(run.uuid)},
            )
        scores = run_scores(run=run)
        return Response({"scores": scores.as_dict(), "leaderboard": run_leaderboard(run=run, scores=scores)})


class NodeViewSet(ScopedReadViewSet):
    model = ResearchNode
    serializer_class = serializers.NodeSerializer
    filterset_class = filters.NodeFilter

    def scoped(self, caller: Caller) -> QuerySet[ResearchNode]:
        edges = Prefetch("upstream_edges", queryset=ResearchEdge.objects.select_related("upstream").order_by("pk"))
        return visible_nodes(caller).select_related("run").prefetch_related(edges).order_by("created_at", "pk")

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        response = super().retrieve(request, *args, **kwargs)
        response["ETag"] = response.data["etag"]
        return response

    @extend_schema(
        responses={200: {"type": "object", "properties": {"node": {"type": "string"},
                                                            "turns": {"type": "array", "items": {"type": "object"}}}}},
        filters=False,
    )  # fmt: skip
    @action(detail=True, methods=["get"], filterset_class=None, pagination_class=None)
    def transcript(self, request: Request, uuid: str | None = None) -> Response:
        """The node's model turns in order (request, response, tool answers, usage); ``?after_seq=`` pages."""
        node = self.get_object()
        transcript_read_check(caller_of(request), node)
        try:
            after = max(0, int(request.query_params.get("after_seq", "0")))
        except ValueError:
            raise ApplicationError("invalid", "after_seq must be a whole number (the last seq you read).") from None
        turns = node_turns(node, after_seq=after, limit=TRANSCRIPT_PAGE)
        return Response({"node": node.handle, "turns": turns, "more": len(turns) == TRANSCRIPT_PAGE})


class _ExperimentRows:
    """Scoped, filtered experiments as the paginator sees them: ``count()`` counts the experiments
    alone (not joined to the tables the columns come from) and a slice gives ``.values()`` rows."""

    def __init__(self, experiments: QuerySet[Experiment]) -> None:
        self.experiments = experiments

    def count(self) -> int:
        return self.experiments.count()

    def __getitem__(self, page: slice) -> QuerySet[Experiment, dict[str, Any]]:
        return serializers.experiment_list_values(self.experiments.prefetch_related(None))[page]


class ExperimentViewSet(ScopedReadViewSet):
    model = Experiment
    serializer_class = serializers.ExperimentSerializer
    filterset_class = filters.ExperimentFilter

    def scoped(self, caller: Caller) -> QuerySet[Experiment]:
        return (
            visible_experiments(caller)
            .select_related("run", "owner", "input_checkpoint", "output_checkpoint")
            .prefetch_related(Prefetch("parents", queryset=Experiment.objects.only("pk", "handle")))
            .order_by("created_at", "pk")
        )

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # A page as ExperimentSerializer gives it, built from .values() rows (see experiment_list_data).
        # A comment, not a docstring: the docstring would become the operation's OpenAPI description.
        rows = _ExperimentRows(self.filter_queryset(self.get_queryset()))
        page = self.paginate_queryset(rows)
        data = serializers.experiment_list_data(list(rows[:]) if page is None else page, caller=caller_of(request))
        return Response(data) if page is None else self.get_paginated_response(data)

    @extend_schema(
        responses={
            200: {
                "type": "object",
                "properties": {
                    "experiment": {"type": "string"},
                    "ancestors": {"type": "array", "items": {"type": "object"}},
                    "descendants": {"type": "array", "items": {"type": "object"}},
                    "hidden": {"type": "integer"},
                    "checkpoint": {"type": "object"},
                },
            }
        },
        filters=False,
    )
    @action(detail=True, methods=["get"], filterset_class=None, pagination_class=None)
    def lineage(self, request: Request, uuid: str | None = None) -> Response:
        """The experiments this one continues and those continuing it, and θ_out's chain to θ0."""
        experiment = self.get_object()
        return Response(lineage_payload(caller_of(request), experiment))


class CheckpointViewSet(ScopedReadViewSet):
    model = Checkpoint
    serializer_class = serializers.CheckpointSerializer
    filterset_class = filters.CheckpointFilter

    def scoped(self, caller: Caller) -> QuerySet[Checkpoint]:
        return visible_checkpoints(caller).select_related("parent").order_by("created_at", "pk")


class DataEntryViewSet(ScopedReadViewSet):
    model = DataEntry
    serializer_class = serializers.DataEntrySerializer
    filterset_class = filters.DataEntryFilter
    content_negotiation_class = AcceptOnlyNegotiation

    def scoped(self, caller: Caller) -> QuerySet[DataEntry]:
        return visible_datapool(caller).order_by("created_at", "pk")


class EvaluationViewSet(ScopedReadViewSet):
    model = Evaluation
    serializer_class = serializers.EvaluationSerializer
    filterset_class = filters.EvaluationFilter

    def scoped(self, caller: Caller) -> QuerySet[Evaluation]:
        return (
            visible_evaluations(caller).select_related("run", "experiment", "checkpoint").order_by("created_at", "pk")
        )

    def get_object(self) -> Evaluation:
        """A sealed evaluation (the final split, another Worker's) is refused and recorded, not hidden."""
        caller = caller_of(self.request)
        lookup = self.kwargs[self.lookup_field]
        parsed = parse_uuid(lookup)
        if parsed is not None and isinstance(caller, ToolContext):
            evaluation = Evaluation.objects.filter(uuid=parsed, run=caller.run).first()
            if evaluation is not None:
                evaluation_read_check(caller, evaluation, tool=f"GET {self.request.path}")
        return super().get_object()

    @extend_schema(responses={200: serializers.EvaluationSampleSerializer(many=True)}, filters=False)
    @action(detail=True, methods=["get"], filterset_class=None)
    def samples(self, request: Request, uuid: str | None = None) -> Response:
        """Per-sample rows (sample id, model output, correct): people and in-scope Reviewers only."""
        evaluation = self.get_object()
        samples_read_check(caller_of(request), evaluation, tool=f"GET {request.path}")
        rows = EvaluationSample.objects.filter(evaluation=evaluation).order_by("sample_id")
        page = self.paginate_queryset(rows)
        data = serializers.EvaluationSampleSerializer(page if page is not None else rows, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)


class ReportViewSet(ScopedReadViewSet):
    model = ReviewReport
    serializer_class = serializers.ReportSerializer
    filterset_class = filters.ReportFilter

    def scoped(self, caller: Caller) -> QuerySet[ReviewReport]:
        return (
            visible_reports(caller)
            .select_related("run__benchmark", "reviewer")
            .prefetch_related("experiments")
            .order_by("created_at", "pk")
        )


class EventViewSet(ScopedReadViewSet):
    model = Event
    serializer_class = serializers.EventSerializer
    filterset_class = filters.EventFilter
    lookup_field = "pk"
    lookup_value_regex = r"[0-9]+"

    def scoped(self, caller: Caller) -> QuerySet[Event]:
        return visible_events(caller).select_related("run").order_by("run_id", "seq")


def register(router: Any) -> None:
    """Register every resource endpoint on the project's DRF router (rsiweb/api.py)."""
    router.register("runs", RunViewSet, basename="run")
    router.register("nodes", NodeViewSet, basename="node")
    router.register("experiments", ExperimentViewSet, basename="experiment")
    router.register("checkpoints", CheckpointViewSet, basename="checkpoint")
    router.register("datapool", DataEntryViewSet, basename="dataentry")
    router.register("evaluations", EvaluationViewSet, basename="evaluation")
    router.register("reports", ReportViewSet, basename="report")
    router.register("events", EventViewSet, basename="event")
