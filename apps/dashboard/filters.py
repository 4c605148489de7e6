"""The runs list's search and filters (django-filter), read from the page's GET form."""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.db import connection
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django_filters.widgets import BooleanWidget

from apps.benchmarks.models import Benchmark
from apps.research.choices import AgentMode, RunStatus
from apps.research.models import Run

ABLATION_CHOICES = (
    ("full", "full system"),
    ("no-reviewer", "--no-reviewer"),
    ("serial-workers", "--serial-workers"),
)


def has_tag(tag: str) -> Q:
    """Runs whose ``tags`` list holds ``tag`` exactly, on PostgreSQL and on the embedded SQLite.

    Django's JSON ``contains`` lookup exists only on PostgreSQL (SQLite raises NotSupportedError,
    which the runs page answered as a bare 500); SQLite reads the array's elements with json_each.
    """
    if connection.vendor == "postgresql":
        return Q(tags__contains=[tag])
    table = Run._meta.db_table
    # The table name is the model's own; the tag is a bound parameter.
    sql = f"SELECT r.id FROM {table} r, json_each(r.tags) t WHERE t.value = %s"
    return Q(pk__in=RawSQL(sql, (tag,)))  # noqa: S611 - the value is bound, the table is ours


class RunFilter(django_filters.FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")
    benchmark = django_filters.ModelChoiceFilter(
        queryset=Benchmark.objects.order_by("name", "version"), empty_label="any benchmark"
    )
    status = django_filters.ChoiceFilter(choices=RunStatus.choices, empty_label="any status")
    policy = django_filters.ChoiceFilter(field_name="agent_mode", choices=AgentMode.choices, empty_label="any policy")
    ablation = django_filters.ChoiceFilter(
        choices=ABLATION_CHOICES, method="by_ablation", empty_label="any arm", label="Ablation arm"
    )
    tag = django_filters.CharFilter(method="by_tag", label="Tag")
    suite = django_filters.UUIDFilter(field_name="suite_cell__suite__uuid", label="Suite")
    starred = django_filters.BooleanFilter(widget=BooleanWidget(), label="Starred")
    created_after = django_filters.DateFilter(
        field_name="created_at", lookup_expr="date__gte", label="From", widget=forms.DateInput(attrs={"type": "date"})
    )
    created_before = django_filters.DateFilter(
        field_name="created_at", lookup_expr="date__lte", label="To", widget=forms.DateInput(attrs={"type": "date"})
    )

    class Meta:
        model = Run
        fields: list[str] = []

    def search(self, queryset: QuerySet[Run], name: str, value: str) -> QuerySet[Run]:
        """Name, benchmark, a tag, or the start of the run's uuid."""
        value = value.strip()
        if not value:
            return queryset
        return queryset.filter(
            Q(name__icontains=value)
            | Q(benchmark__name__icontains=value)
            | has_tag(value.lower())
            | Q(uuid__startswith=value.lower())
        )

    def by_tag(self, queryset: QuerySet[Run], name: str, value: str) -> QuerySet[Run]:
        value = value.strip().lower()
        return queryset.filter(has_tag(value)) if value else queryset

    def by_ablation(self, queryset: QuerySet[Run], name: str, value: Any) -> QuerySet[Run]:
        # A policy written before a switch existed has no key: it ran the full system's default.
        # (Spelled out: NOT (policy->key = x) is NULL, not true, where the key is missing.)
        if value == "no-reviewer":
            return queryset.filter(policy__reviewers=False)
        if value == "serial-workers":
            return queryset.filter(policy__serial_workers=True)
        reviewers = ~Q(policy__has_key="reviewers") | Q(policy__reviewers=True)
        parallel = ~Q(policy__has_key="serial_workers") | Q(policy__serial_workers=False)
        return queryset.filter(reviewers & parallel)
