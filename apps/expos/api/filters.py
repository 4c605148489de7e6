"""django-filter filtersets of the read-only resource endpoints."""

from __future__ import annotations

from typing import Any

import django_filters as filters
from django import forms

from apps.benchmarks.models import Split
from apps.datapool.models import DataEntry, DataFormat, SourceKind
from apps.experiments.choices import EvaluationStatus, ExperimentKind, ExperimentStatus, IntegrityStatus
from apps.experiments.models import Checkpoint, Evaluation, Event, Experiment
from apps.research.choices import NodeKind, NodeStatus, RunStatus
from apps.research.models import ResearchNode, Run
from apps.reviews.models import ReportStatus, ReviewReport

MAX_SEQ = 2**62


class WholeNumberFilter(filters.NumberFilter):
    """A whole-number filter (a sequence number): 1.5 is refused, as the document's integer says."""

    field_class = forms.IntegerField  # type: ignore[assignment]  # an integer field where DRF's is decimal


class StrictBooleanField(forms.NullBooleanField):
    """``true`` or ``false`` (``1``/``0``): any other word is refused, not read as "no filter"."""

    widget = forms.TextInput  # the raw text: django's boolean widgets turn unknown words into None

    def to_python(self, value: Any) -> bool | None:  # type: ignore[override]  # stubs: BooleanField; a NullBooleanField returns None too
        if value in (None, ""):
            return None
        word = str(value).strip().lower()
        if word in ("true", "1"):
            return True
        if word in ("false", "0"):
            return False
        raise forms.ValidationError("Give true or false.", code="invalid")


class StrictBooleanFilter(filters.BooleanFilter):
    field_class = StrictBooleanField


class StrictFilterSet(filters.FilterSet):
    """A filter given with an empty value (``?run=``) is a 400 naming it, not "no filter".

    The OpenAPI document types every filter (a uuid, an enum...), and an empty string is none of
    them: leave the parameter out to not filter.
    """

    def is_valid(self) -> bool:
        valid = super().is_valid()
        data: Any = self.data or {}
        for name in self.filters:
            values = data.getlist(name) if hasattr(data, "getlist") else [data.get(name)]
            if name in data and any(value == "" for value in values):
                self.form.add_error(name, "Give a value, or leave the parameter out to not filter by it.")
                valid = False
        return valid


class RunFilter(StrictFilterSet):
    status = filters.ChoiceFilter(choices=RunStatus.choices)
    benchmark = filters.CharFilter(field_name="benchmark__name", max_length=200)

    class Meta:
        model = Run
        fields = ["status", "benchmark"]


class NodeFilter(StrictFilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    kind = filters.ChoiceFilter(choices=NodeKind.choices)
    status = filters.ChoiceFilter(choices=NodeStatus.choices)
    handle = filters.CharFilter(max_length=32)

    class Meta:
        model = ResearchNode
        fields = ["run", "kind", "status", "handle"]


class ExperimentFilter(StrictFilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    owner = filters.CharFilter(field_name="owner__handle", max_length=32)
    status = filters.ChoiceFilter(choices=ExperimentStatus.choices)
    integrity_status = filters.ChoiceFilter(choices=IntegrityStatus.choices)
    kind = filters.ChoiceFilter(choices=ExperimentKind.choices)

    class Meta:
        model = Experiment
        fields = ["run", "owner", "status", "integrity_status", "kind"]


class CheckpointFilter(StrictFilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    is_base = StrictBooleanFilter()
    handle = filters.CharFilter(max_length=64)

    class Meta:
        model = Checkpoint
        fields = ["run", "is_base", "handle"]


class DataEntryFilter(StrictFilterSet):
    format = filters.ChoiceFilter(choices=DataFormat.choices)
    source_kind = filters.ChoiceFilter(choices=SourceKind.choices)
    name = filters.CharFilter(lookup_expr="icontains", max_length=200)
    handle = filters.CharFilter(max_length=32)

    class Meta:
        model = DataEntry
        fields = ["format", "source_kind", "name", "handle"]


class EvaluationFilter(StrictFilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    experiment = filters.UUIDFilter(field_name="experiment__uuid")
    split = filters.ChoiceFilter(choices=Split.choices)
    status = filters.ChoiceFilter(choices=EvaluationStatus.choices)

    class Meta:
        model = Evaluation
        fields = ["run", "experiment", "split", "status"]


class ReportFilter(StrictFilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    reviewer = filters.CharFilter(field_name="reviewer__handle", max_length=32)
    status = filters.ChoiceFilter(choices=ReportStatus.choices)

    class Meta:
        model = ReviewReport
        fields = ["run", "reviewer", "status"]


class EventFilter(StrictFilterSet):
    run = filters.UUIDFilter(field_name="run__uuid")
    type = filters.CharFilter(max_length=100)
    actor = filters.CharFilter(max_length=200)
    tool = filters.CharFilter(max_length=100)
    after_seq = WholeNumberFilter(field_name="seq", lookup_expr="gt", min_value=0, max_value=MAX_SEQ)

    class Meta:
        model = Event
        fields = ["run", "type", "actor", "tool", "after_seq"]
