"""Tool endpoints, generated from the registry (apps.expos.registry); included under /api/v1/."""

from __future__ import annotations

from django.urls import path

from apps.expos.api.dojo import TrajectoryExportView
from apps.expos.uploads import ToolUploadView
from apps.expos.views import ToolCallView, ToolDefinitionsView, ToolListView

urlpatterns = [
    path("tools", ToolListView.as_view(), name="tool-list"),
    path("tools/definitions", ToolDefinitionsView.as_view(), name="tool-definitions"),
    path("tools/<str:name>/upload", ToolUploadView.as_view(), name="tool-upload"),
    path("tools/<str:name>", ToolCallView.as_view(), name="tool-call"),
    path("dojo/trajectory-exports", TrajectoryExportView.as_view(), name="dojo-trajectory-exports"),
]
