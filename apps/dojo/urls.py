"""Agent-suite endpoints, included under /api/v1/suites/ (apps/dojo/views.py)."""

from __future__ import annotations

from django.urls import path

from apps.dojo.views import SuiteDetailView, SuiteLaunchView, SuiteListView

urlpatterns = [
    path("", SuiteListView.as_view(), name="suite-list"),
    path("<str:suite_uuid>/", SuiteDetailView.as_view(), name="suite-detail"),
    path("<str:suite_uuid>/launch", SuiteLaunchView.as_view(), name="suite-launch"),
]
