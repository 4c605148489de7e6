"""django-filter filtersets of the read-only resource endpoints."""

from __future__ import annotations

import django_filters as filters

from apps.benchmarks.models import Split
from apps.datapool.models import DataEntry, DataFormat, SourceKind
from apps.experiments.choices import EvaluationStatus, ExperimentKind, ExperimentStatus, IntegrityStatus
from apps.experiments.models import Checkpoint, Evaluation, Event, Experiment
from apps.research.choices import NodeKind, NodeStatus, RunStatus
from apps.research.models import ResearchNode, Run
from apps.reviews.models import ReportStatus, ReviewReport

MAX_SEQ = 2**62


class RunFilter(filters.FilterSet):
    status = filters.ChoiceFilter(choices=RunStatus.choices)
    benchmark = filters.CharFilter(field_name="benchmark__name", max_length=200)

    class Meta:
        model = Run
        fields = ["status", "benchmark"]


class NodeFilter(filters.FilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    kind = filters.ChoiceFilter(choices=NodeKind.choices)
    status = filters.ChoiceFilter(choices=NodeStatus.choices)
    handle = filters.CharFilter(max_length=32)

    class Meta:
        model = ResearchNode
        fields = ["run", "kind", "status", "handle"]


class ExperimentFilter(filters.FilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    owner = filters.CharFilter(field_name="owner__handle", max_length=32)
    status = filters.ChoiceFilter(choices=ExperimentStatus.choices)
    integrity_status = filters.ChoiceFilter(choices=IntegrityStatus.choices)
    kind = filters.ChoiceFilter(choices=ExperimentKind.choices)

    class Meta:
        model = Experiment
        fields = ["run", "owner", "status", "integrity_status", "kind"]


class CheckpointFilter(filters.FilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    is_base = filters.BooleanFilter()
    handle = filters.CharFilter(max_length=64)

    class Meta:
        model = Checkpoint
        fields = ["run", "is_base", "handle"]


class DataEntryFilter(filters.FilterSet):
    format = filters.ChoiceFilter(choices=DataFormat.choices)
    source_kind = filters.ChoiceFilter(choices=SourceKind.choices)
    name = filters.CharFilter(lookup_expr="icontains", max_length=200)
    handle = filters.CharFilter(max_length=32)

    class Meta:
        model = DataEntry
        fields = ["format", "source_kind", "name", "handle"]


class EvaluationFilter(filters.FilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    experiment = filters.UUIDFilter(field_name="experiment__uuid")
    split = filters.ChoiceFilter(choices=Split.choices)
    status = filters.ChoiceFilter(choices=EvaluationStatus.choices)

    class Meta:
        model = Evaluation
        fields = ["run", "experiment", "split", "status"]


class ReportFilter(filters.FilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    reviewer = filters.CharFilter(field_name="reviewer__handle", max_length=32)
    status = filters.ChoiceFilter(choices=ReportStatus.choices)

    class Meta:
        model = ReviewReport
        fields = ["run", "reviewer", "status"]


class EventFilter(filters.FilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    type = filters.CharFilter(max_length=100)
    actor = filters.CharFilter(max_length=200)
    tool = filters.CharFilter(max_length=100)
    after_seq = filters.NumberFilter(field_name="seq", lookup_expr="gt", min_value=0, max_value=MAX_SEQ)

    class Meta:
        model = Event
        fields = ["run", "type", "actor", "tool", "after_seq"]
