"""Output serializers of the read-only resource endpoints.

Each reads the caller from ``context["caller"]`` (apps.expos.visibility) so that what it shows —
rounded scores for agents, redacted reports for the Main Agent — follows the same rules as the tools.
"""

from __future__ import annotations

import json
from typing import Any, cast

from django.conf import settings
from django.db import connection
from django.db.models import CharField, Func, QuerySet, TextField
from django.db.models.functions import Cast
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.datapool.models import DataEntry
from apps.experiments.models import Checkpoint, Evaluation, EvaluationSample, Event, Experiment
from apps.experiments.selectors import experiment_parent_handles
from apps.expos.registry import Role, ToolContext
from apps.expos.visibility import event_arguments_for, score_for
from apps.flows.reports import main_scrub, report_payload
from apps.research.models import ResearchNode, Run
from apps.reviews.models import ReviewReport


def _caller(serializer: serializers.Serializer) -> Any:
    return serializer.context["caller"]


class RunSerializer(serializers.ModelSerializer):
    benchmark = serializers.CharField(source="benchmark.name", read_only=True)
    base_checkpoint = serializers.CharField(source="base_checkpoint.handle", read_only=True)

    class Meta:
        model = Run
        fields = [
            "uuid",
            "name",
            "benchmark",
            "base_checkpoint",
            "target_capability",
            "agent_mode",
            "search_policy",
            "status",
            "budget_wall_seconds",
            "budget_accelerator_seconds",
            "budget_llm_tokens",
            "max_parallel_workers",
            "reserved_final_seconds",
            "used_accelerator_seconds",
            "used_llm_tokens",
            "flagged",
            "started_at",
            "finished_at",
            "created_at",
        ]


class NodeSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run.uuid", read_only=True)
    upstream = serializers.SerializerMethodField()
    etag = serializers.SerializerMethodField()

    class Meta:
        model = ResearchNode
        fields = [
            "uuid",
            "run",
            "kind",
            "handle",
            "task",
            "status",
            "summary",
            "summary_experiments",
            "upstream",
            "version",
            "etag",
            "created_at",
            "finalized_at",
        ]

    @extend_schema_field(
        {
            "type": "array",
            "items": {"type": "object", "properties": {"handle": {"type": "string"}, "kind": {"type": "string"}}},
        }
    )
    def get_upstream(self, node: ResearchNode) -> list[dict[str, str]]:
        return [{"handle": e.upstream.handle, "kind": e.kind} for e in node.upstream_edges.all()]

    @extend_schema_field(OpenApiTypes.STR)
    def get_etag(self, node: ResearchNode) -> str:
        return f'"{node.uuid}.{node.version}"'


class ExperimentSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run.uuid", read_only=True)
    owner = serializers.CharField(source="owner.handle", read_only=True)
    input_checkpoint = serializers.CharField(source="input_checkpoint.handle", read_only=True)
    output_checkpoint = serializers.CharField(source="output_checkpoint.handle", read_only=True, allow_null=True)
    parents = serializers.SerializerMethodField()
    feedback_score = serializers.SerializerMethodField()

    class Meta:
        model = Experiment
        fields = [
            "uuid",
            "run",
            "handle",
            "owner",
            "kind",
            "status",
            "integrity_status",
            "input_checkpoint",
            "output_checkpoint",
            "action",
            "claim",
            "feedback_score",
            "parents",
            "created_at",
        ]

    @extend_schema_field({"type": "array", "items": {"type": "string"}})
    def get_parents(self, experiment: Experiment) -> list[str]:
        return sorted(p.handle for p in experiment.parents.all())

    @extend_schema_field({"type": ["number", "null"]})
    def get_feedback_score(self, experiment: Experiment) -> float | None:
        return score_for(_caller(self), experiment.feedback_score)


# The experiment list serves up to 1,000 rows a page. Building them from ``.values()`` rows
# (plus one query for all parents) instead of five model instances and DRF's field-by-field walk
# per row makes it several times faster. The answer must stay exactly ExperimentSerializer's
# (which still documents it and serves single experiments): tests/apps/expos/test_experiment_list.py
# compares the two.
EXPERIMENT_LIST_COLUMNS = (
    "pk",
    "uuid",
    "run__uuid",
    "handle",
    "owner__handle",
    "kind",
    "status",
    "integrity_status",
    "input_checkpoint__handle",
    "output_checkpoint__handle",
    "action",
    "claim",
    "feedback_score",
    "created_at",
)


# On PostgreSQL in UTC the database writes the uuids and created_at as the serializer would: their
# Python loaders (uuid.UUID, an aware datetime) and DRF's formatting were a third of the CPU of a
# 1,000-row page (bench/profile_append.py --list 1000). DRF writes ``datetime.isoformat()``, with
# no fraction when the microseconds are 0, and "+00:00" as "Z".
_UTC = "(%(expressions)s AT TIME ZONE 'UTC')"


class _IsoUtc(Func):
    output_field = CharField()
    template = (
        f"to_char({_UTC}, 'YYYY-MM-DD\"T\"HH24:MI:SS') || "
        f"CASE WHEN to_char({_UTC}, 'US') = '000000' THEN '' ELSE to_char({_UTC}, '.US') END || 'Z'"
    )


EXPERIMENT_LIST_TEXT = {
    "uuid_text": Cast("uuid", output_field=CharField()),
    "run_uuid_text": Cast("run__uuid", output_field=CharField()),
    "created_at_text": _IsoUtc("created_at"),
    # As JSON text, parsed for the whole page at once (one json.loads per row was a third of what remained).
    "action_text": Cast("action", output_field=TextField()),
}
_AS_TEXT = {"uuid", "run__uuid", "created_at", "action"}


def experiment_list_values(experiments: QuerySet[Experiment]) -> QuerySet[Experiment, dict[str, Any]]:
    """``experiments`` as the rows experiment_list_data takes."""
    if connection.vendor == "postgresql" and settings.USE_TZ and timezone.get_current_timezone_name() == "UTC":
        columns = [column for column in EXPERIMENT_LIST_COLUMNS if column not in _AS_TEXT]
        rows = experiments.annotate(**EXPERIMENT_LIST_TEXT).values(*columns, *EXPERIMENT_LIST_TEXT)
    else:
        rows = experiments.values(*EXPERIMENT_LIST_COLUMNS)
    return cast("QuerySet[Experiment, dict[str, Any]]", rows)


def experiment_list_data(rows: list[dict[str, Any]], *, caller: Any) -> list[dict[str, Any]]:
    """ExperimentSerializer's representation of ``rows`` (from experiment_list_values)."""
    parents = experiment_parent_handles(row["pk"] for row in rows)
    if rows and "created_at_text" in rows[0]:
        uuid, run, created_at = "uuid_text", "run_uuid_text", "created_at_text"
        actions = json.loads(f"[{','.join(row['action_text'] or 'null' for row in rows)}]")
        for row, value in zip(rows, actions, strict=True):
            row["action"] = value
    else:
        # The ModelSerializer's own field, its time zone looked up once rather than once per row.
        zone = timezone.get_current_timezone() if settings.USE_TZ else None
        field = serializers.DateTimeField(default_timezone=zone)
        for row in rows:
            row["uuid"], row["run__uuid"] = str(row["uuid"]), str(row["run__uuid"])
            row["created_at"] = field.to_representation(row["created_at"])
        uuid, run, created_at = "uuid", "run__uuid", "created_at"
    return [
        {
            "uuid": row[uuid],
            "run": row[run],
            "handle": row["handle"],
            "owner": row["owner__handle"],
            "kind": row["kind"],
            "status": row["status"],
            "integrity_status": row["integrity_status"],
            "input_checkpoint": row["input_checkpoint__handle"],
            "output_checkpoint": row["output_checkpoint__handle"],
            "action": row["action"],
            "claim": row["claim"],
            "feedback_score": score_for(caller, row["feedback_score"]),
            "parents": sorted(parents[row["pk"]]),
            "created_at": row[created_at],
        }
        for row in rows
    ]


class CheckpointSerializer(serializers.ModelSerializer):
    parent = serializers.CharField(source="parent.handle", read_only=True, allow_null=True)

    class Meta:
        model = Checkpoint
        fields = ["uuid", "handle", "manifest_sha256", "parent", "is_base", "is_reference", "created_at"]


class DataEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = DataEntry
        fields = [
            "uuid",
            "handle",
            "name",
            "sha256",
            "rows",
            "size_bytes",
            "format",
            "schema",
            "source_kind",
            "source",
            "teacher",
            "created_at",
        ]


class EvaluationSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run.uuid", read_only=True, allow_null=True)
    experiment = serializers.CharField(source="experiment.handle", read_only=True, allow_null=True)
    checkpoint = serializers.CharField(source="checkpoint.handle", read_only=True)
    score = serializers.SerializerMethodField()
    correct = serializers.SerializerMethodField()

    class Meta:
        model = Evaluation
        fields = [
            "uuid",
            "run",
            "experiment",
            "checkpoint",
            "split",
            "status",
            "score",
            "correct",
            "sample_count",
            "evaluator_sha256",
            "settings_sha256",
            "data_sha256",
            "backend",
            "created_at",
        ]

    @extend_schema_field({"type": ["number", "null"]})
    def get_score(self, evaluation: Evaluation) -> float | None:
        return score_for(_caller(self), evaluation.score)

    @extend_schema_field({"type": ["integer", "null"]})
    def get_correct(self, evaluation: Evaluation) -> int | None:
        # The exact count would undo the score's rounding: only those who may see samples get it.
        caller = _caller(self)
        if isinstance(caller, ToolContext) and caller.role != Role.REVIEWER:
            return None
        return evaluation.correct


class EvaluationSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = EvaluationSample
        fields = ["sample_id", "output", "correct"]


class ReportSerializer(serializers.Serializer):
    """The report as inspect_reviewer_report gives it: redacted for the Main Agent.

    The fields below document the shape; ``to_representation`` builds it with the reviews selector.
    """

    run = serializers.UUIDField()
    uuid = serializers.UUIDField()
    reviewer = serializers.CharField()
    status = serializers.CharField()
    summary = serializers.CharField()
    experiments = serializers.ListField(child=serializers.CharField())
    supported_findings = serializers.ListField(child=serializers.CharField())
    uncertainties = serializers.ListField(child=serializers.CharField())
    protocol_violations = serializers.ListField(child=serializers.CharField())
    regressions = serializers.ListField(child=serializers.CharField())
    missing_comparisons = serializers.ListField(child=serializers.CharField())
    recommendations = serializers.ListField(child=serializers.CharField())
    observations = serializers.ListField(child=serializers.DictField())
    created_at = serializers.DateTimeField()
    redacted = serializers.BooleanField()

    def to_representation(self, report: ReviewReport) -> dict[str, Any]:  # type: ignore[override]
        caller = _caller(self)
        redacted = isinstance(caller, ToolContext) and caller.role == Role.MAIN
        scrub = None
        if redacted:
            # One scrub per run for a whole page: its sealed screen and output scanner are read once.
            scrubs = cast(dict[str, Any], self.context).setdefault("main_scrubs", {})  # the root's own dict
            scrub = scrubs.get(report.run_id) or scrubs.setdefault(report.run_id, main_scrub(report))
        return {"run": str(report.run.uuid), **report_payload(report, redacted=redacted, scrub=scrub)}


class EventSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run.uuid", read_only=True, allow_null=True)
    arguments = serializers.SerializerMethodField()

    class Meta:
        model = Event
        fields = ["id", "seq", "run", "created_at", "type", "actor", "role", "tool", "arguments", "result_ref", "hash"]

    @extend_schema_field({"type": "object"})
    def get_arguments(self, event: Event) -> dict[str, Any]:
        return event_arguments_for(_caller(self), event)
