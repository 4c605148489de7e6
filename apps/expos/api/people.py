"""People's notes and alert rules over the REST API (issue 36): what the run, experiment and alert
pages do, for scripts.

    GET  /api/v1/runs/<uuid>/note/                 the newest version (ETag ``"note.<uuid>.<version>"``)
    PUT  /api/v1/runs/<uuid>/note/                 {"text": ...}: the next version; If-Match optional
    GET  /api/v1/runs/<uuid>/note/versions/        every version, newest first (paginated)
    ...  /api/v1/experiments/<uuid>/note/[versions/]   the same for one experiment
    GET  /api/v1/alerts/   POST /api/v1/alerts/   GET|DELETE /api/v1/alerts/<uuid>/   your own rules

Permissions are the dashboard's (apps.dashboard.permissions): a viewer reads notes and keeps alert
rules of their own, an operator writes notes. Notes and alerts are people's: an agent token is
refused (403), whatever its role. A person signs in with the Django session (an unsafe method
needs the CSRF token, as every session-authenticated call).

A note that is not written yet reads as version 0 with empty text, so a first write can send
If-Match too. A stale If-Match answers 412 ``precondition_failed`` with the current ETag; the check
and the write happen under the lock that numbers the versions (apps.research.notes.note_add).
Bad input answers 400 naming the field, and nothing is stored.
"""

from __future__ import annotations

import re
from typing import Any, cast

from django.contrib.auth.models import User
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from apps.alerts.choices import AlertChannel, AlertTrigger
from apps.alerts.models import AlertRule
from apps.alerts.services import alert_rule_create, alert_rule_delete, target_display
from apps.core.errors import ApplicationError, NotFound
from apps.core.jsonsafe import first_bad_value
from apps.core.people import is_human_operator, is_human_viewer
from apps.experiments.models import Experiment
from apps.expos.api.views import UUID_PATH, BoundedLimitOffsetPagination
from apps.expos.auth import AgentTokenAuthentication, AgentTokenRateThrottle, agent_token_of
from apps.expos.selectors import parse_uuid
from apps.research.models import Note, Run
from apps.research.notes import NOTE_MAX_CHARS, note_add, note_versions

ALERT_DELIVERIES_SHOWN = 5
MAX_IF_MATCH = 200
_NOTE_ETAG = re.compile(r'^(?:W/)?"?note\.([0-9a-f-]{36})\.([0-9]{1,9})"?$')


class PeopleOnly(BasePermission):
    """A viewer reads and keeps their alerts; writing a note needs an operator; agents never."""

    message = "Sign in as a viewer, operator or admin."

    def has_permission(self, request: Request, view: Any) -> bool:
        if agent_token_of(request) is not None:
            self.message = "Notes and alerts are people's: an agent token may not read or change them."
            return False
        if request.method not in SAFE_METHODS and getattr(view, "writes_need_operator", False):
            self.message = "Writing a note needs the operator role."
            return is_human_operator(request.user)
        return is_human_viewer(request.user)


class _PeopleAPI(GenericAPIView):  # type: ignore[type-arg]
    authentication_classes = [AgentTokenAuthentication, SessionAuthentication]
    permission_classes = [PeopleOnly]
    throttle_classes = [AgentTokenRateThrottle]


class _Strict(serializers.Serializer):  # type: ignore[type-arg]
    """A body with exactly this serializer's fields, and no value a record cannot keep."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: [f"Unknown field; send only {', '.join(self.fields)}."] for name in unknown}
                )
            bad = first_bad_value(data)
            if bad is not None:
                raise ApplicationError("invalid_input", bad.message, path=bad.pointer, rule=bad.rule)
        return super().to_internal_value(data)


# --- notes -----------------------------------------------------------------------------------------


class NoteSerializer(serializers.Serializer):  # type: ignore[type-arg]
    subject = serializers.CharField(help_text='"run", or the experiment\'s handle (exp_0003).')
    run = serializers.UUIDField()
    experiment = serializers.UUIDField(allow_null=True)
    version = serializers.IntegerField(help_text="1, 2, ...; 0 when no note is written yet.")
    text = serializers.CharField(allow_blank=True, help_text="Markdown.")
    author = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField(allow_null=True)
    etag = serializers.CharField(help_text="Send it as If-Match with your next write.")


class NoteVersionSerializer(serializers.Serializer):  # type: ignore[type-arg]
    version = serializers.IntegerField()
    text = serializers.CharField()
    author = serializers.CharField()
    created_at = serializers.DateTimeField()


class TextField(serializers.CharField):
    """A JSON string and nothing else (DRF's CharField would take 7 as "7")."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class NoteWriteSerializer(_Strict):
    text = TextField(allow_blank=True, trim_whitespace=False, help_text=f"Markdown, 1 to {NOTE_MAX_CHARS} characters.")


def note_etag(subject_uuid: Any, version: int) -> str:
    return f'"note.{subject_uuid}.{version}"'


def _if_match_versions(header: str | None, subject_uuid: Any) -> set[int] | None:
    """The note versions an If-Match header names for this subject; None without one (or ``*``)."""
    if header is None:
        return None
    if len(header) > MAX_IF_MATCH or not header.strip():
        raise ApplicationError("invalid_if_match", f"If-Match is the note's ETag as read (at most {MAX_IF_MATCH} "
                               'characters), e.g. "note.<uuid>.3".')  # fmt: skip
    versions: set[int] = set()
    for candidate in header.split(","):
        tag = candidate.strip()
        if tag == "*":
            return None
        found = _NOTE_ETAG.match(tag)
        if found and found.group(1) == str(subject_uuid):
            versions.add(int(found.group(2)))
    return versions  # empty: no tag of this note, so no version matches (412)


class _NoteView(_PeopleAPI):
    writes_need_operator = True
    serializer_class = NoteSerializer
    queryset = Note.objects.none()  # the schema's model; reads go through apps.research.notes

    def subject(self, key: str) -> tuple[Run, Experiment | None]:
        raise NotImplementedError

    def _current(self, run: Run, experiment: Experiment | None) -> Response:
        subject_uuid = experiment.uuid if experiment is not None else run.uuid
        note: Note | None = note_versions(run=run, experiment=experiment).first()
        version = note.version if note is not None else 0
        etag = note_etag(subject_uuid, version)
        body = {
            "subject": experiment.handle if experiment is not None else "run",
            "run": str(run.uuid),
            "experiment": str(experiment.uuid) if experiment is not None else None,
            "version": version,
            "text": note.text if note is not None else "",
            "author": note.author.get_username() if note is not None else None,
            "created_at": note.created_at.isoformat() if note is not None else None,
            "etag": etag,
        }
        response = Response(body)
        response["ETag"] = etag
        return response

    def get(self, request: Request, key: str) -> Response:
        run, experiment = self.subject(key)
        return self._current(run, experiment)

    def put(self, request: Request, key: str) -> Response:
        run, experiment = self.subject(key)
        subject_uuid = experiment.uuid if experiment is not None else run.uuid
        versions = _if_match_versions(request.headers.get("If-Match"), subject_uuid)
        body = NoteWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            note_add(run=run, author=request.user, text=body.validated_data["text"], experiment=experiment,
                     if_version_in=versions)  # fmt: skip
        except ApplicationError as error:
            if error.code == "precondition_failed":
                error.detail["current_etag"] = note_etag(subject_uuid, error.detail["current_version"])
            raise
        return self._current(run, experiment)


class _NoteVersionsView(_PeopleAPI):
    serializer_class = NoteVersionSerializer
    pagination_class = BoundedLimitOffsetPagination
    queryset = Note.objects.none()  # the schema's model; reads go through apps.research.notes

    def subject(self, key: str) -> tuple[Run, Experiment | None]:
        raise NotImplementedError

    def get(self, request: Request, key: str) -> Response:
        run, experiment = self.subject(key)
        notes = note_versions(run=run, experiment=experiment)
        page = self.paginate_queryset(notes)
        rows = [{"version": n.version, "text": n.text, "author": n.author.get_username(), "created_at": n.created_at}
                for n in (page if page is not None else notes)]  # fmt: skip
        data = NoteVersionSerializer(rows, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)


def _run(key: str) -> tuple[Run, None]:
    found = parse_uuid(key)
    run = Run.objects.filter(uuid=found).first() if found is not None else None
    if run is None:
        raise NotFound("not_found", f"No run {key!r}; list runs at /api/v1/runs/.")
    return run, None


def _experiment(key: str) -> tuple[Run, Experiment]:
    found = parse_uuid(key)
    experiment = Experiment.objects.select_related("run").filter(uuid=found).first() if found is not None else None
    if experiment is None:
        raise NotFound("not_found", f"No experiment {key!r}; list them at /api/v1/experiments/?run=<uuid>.")
    return experiment.run, experiment


_NOTE_DOC = (
    "PUT adds the next version of the note (markdown, 1 to 20,000 characters). If-Match: the ETag as last "
    "read (version 0 before any note); a stale one answers 412 precondition_failed with the current ETag. "
    "Viewers read; operators write; agent tokens are refused."
)
_IF_MATCH = OpenApiParameter(
    "If-Match", str, OpenApiParameter.HEADER, required=False, description="The note's ETag as last read."
)
_NOTE_RESPONSES = {200: NoteSerializer}  # 412 precondition_failed: apps.expos.openapi.postprocess


@extend_schema(tags=["notes"], description=_NOTE_DOC)
class RunNoteView(_NoteView):
    def subject(self, key: str) -> tuple[Run, Experiment | None]:
        return _run(key)

    @extend_schema(responses={200: NoteSerializer}, operation_id="run_note_read")
    def get(self, request: Request, key: str) -> Response:
        return super().get(request, key)

    @extend_schema(request=NoteWriteSerializer, responses=_NOTE_RESPONSES, parameters=[_IF_MATCH],
                   operation_id="run_note_write")  # fmt: skip
    def put(self, request: Request, key: str) -> Response:
        return super().put(request, key)


@extend_schema(tags=["notes"], description=_NOTE_DOC)
class ExperimentNoteView(_NoteView):
    def subject(self, key: str) -> tuple[Run, Experiment | None]:
        return _experiment(key)

    @extend_schema(responses={200: NoteSerializer}, operation_id="experiment_note_read")
    def get(self, request: Request, key: str) -> Response:
        return super().get(request, key)

    @extend_schema(request=NoteWriteSerializer, responses=_NOTE_RESPONSES, parameters=[_IF_MATCH],
                   operation_id="experiment_note_write")  # fmt: skip
    def put(self, request: Request, key: str) -> Response:
        return super().put(request, key)


@extend_schema(tags=["notes"])
class RunNoteVersionsView(_NoteVersionsView):
    def subject(self, key: str) -> tuple[Run, Experiment | None]:
        return _run(key)

    @extend_schema(responses={200: NoteVersionSerializer(many=True)}, operation_id="run_note_versions")
    def get(self, request: Request, key: str) -> Response:
        return super().get(request, key)


@extend_schema(tags=["notes"])
class ExperimentNoteVersionsView(_NoteVersionsView):
    def subject(self, key: str) -> tuple[Run, Experiment | None]:
        return _experiment(key)

    @extend_schema(responses={200: NoteVersionSerializer(many=True)}, operation_id="experiment_note_versions")
    def get(self, request: Request, key: str) -> Response:
        return super().get(request, key)


# --- alerts ----------------------------------------------------------------------------------------


class AlertDeliverySerializer(serializers.Serializer):  # type: ignore[type-arg]
    trigger = serializers.CharField()
    status = serializers.CharField()
    attempts = serializers.IntegerField()
    error = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    sent_at = serializers.DateTimeField(allow_null=True)


class AlertRuleSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    target = serializers.SerializerMethodField(help_text="An e-mail address, or a webhook's scheme and host only.")
    run: serializers.SlugRelatedField[Run] = serializers.SlugRelatedField(
        slug_field="uuid", read_only=True, allow_null=True
    )
    deliveries = serializers.SerializerMethodField()

    class Meta:
        model = AlertRule
        fields = ["uuid", "channel", "target", "triggers", "run", "active", "created_at", "deliveries"]

    def get_target(self, rule: AlertRule) -> str:
        return target_display(rule)

    @extend_schema_field(AlertDeliverySerializer(many=True))
    def get_deliveries(self, rule: AlertRule) -> list[dict[str, Any]]:
        recent = rule.deliveries.order_by("-created_at", "-pk")[:ALERT_DELIVERIES_SHOWN]
        return list(AlertDeliverySerializer(recent, many=True).data)


class AlertRuleCreateSerializer(_Strict):
    channel = serializers.ChoiceField(choices=AlertChannel.choices)
    target = TextField(max_length=500, help_text="The webhook's http(s) URL, or an e-mail address.")
    triggers = serializers.ListField(
        child=serializers.ChoiceField(choices=AlertTrigger.choices), min_length=1, max_length=len(AlertTrigger.values)
    )
    run = serializers.UUIDField(required=False, allow_null=True, help_text="One run; leave out for every run.")


@extend_schema(tags=["alerts"])
class AlertRuleViewSet(
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.ViewSetMixin,
    _PeopleAPI,
):
    """Your alert rules: be told when a run finishes or fails, is flagged, spends a budget, or a job
    fails, by a Slack or Discord webhook or e-mail (docs/workbench.md, "Alerts"). Another person's
    rules are not listed and answer 404."""

    serializer_class = AlertRuleSerializer
    pagination_class = BoundedLimitOffsetPagination
    lookup_field = "uuid"
    lookup_value_regex = UUID_PATH

    def get_queryset(self) -> QuerySet[AlertRule]:
        if getattr(self, "swagger_fake_view", False):
            return AlertRule.objects.none()
        return (
            AlertRule.objects.filter(owner=cast(User, self.request.user))
            .select_related("run")
            .order_by("-created_at", "-pk")
        )

    def get_object(self) -> AlertRule:
        found = parse_uuid(self.kwargs["uuid"])
        rule = self.get_queryset().filter(uuid=found).first() if found is not None else None
        if rule is None:
            raise NotFound(
                "not_found", f"No alert rule {self.kwargs['uuid']!r} of yours; list them at /api/v1/alerts/."
            )
        return rule

    @extend_schema(request=AlertRuleCreateSerializer, responses={201: AlertRuleSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = AlertRuleCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        run: Run | None = None
        if data.get("run") is not None:
            run = Run.objects.filter(uuid=data["run"]).first()
            if run is None:
                raise ApplicationError("invalid_run", f"No run {data['run']}; leave run out to be told of every run.",
                                       field="run")  # fmt: skip
        rule = alert_rule_create(owner=request.user, run=run, channel=data["channel"], target=data["target"],
                                 triggers=list(data["triggers"]))  # fmt: skip
        return Response(AlertRuleSerializer(rule).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: AlertRule) -> None:
        alert_rule_delete(rule=instance)
