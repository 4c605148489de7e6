"""Integrity endpoints, included under /api/v1/integrity/."""

from __future__ import annotations

from django.urls import path

from apps.integrity.views import ExperimentFindingsView, FindingAdjudicateView, RunIntegrityReportView

urlpatterns = [
    path("runs/<str:run_uuid>/report", RunIntegrityReportView.as_view(), name="integrity-run-report"),
    path("experiments/<str:experiment_uuid>/findings", ExperimentFindingsView.as_view(), name="integrity-findings"),
    path(
        "experiments/<str:experiment_uuid>/findings/<str:subcategory>/adjudicate",
        FindingAdjudicateView.as_view(),
        name="integrity-finding-adjudicate",
    ),
]
