"""Tool endpoints, generated from the registry (apps.expos.registry); included under /api/v1/."""

from __future__ import annotations

from django.urls import path

from apps.expos.api.dojo import TrajectoryExportView
from apps.expos.api.people import ExperimentNoteVersionsView, ExperimentNoteView, RunNoteVersionsView, RunNoteView
from apps.expos.uploads import ToolUploadView
from apps.expos.views import ToolCallView, ToolDefinitionsView, ToolListView

urlpatterns = [
    path("tools", ToolListView.as_view(), name="tool-list"),
    path("tools/definitions", ToolDefinitionsView.as_view(), name="tool-definitions"),
    path("tools/<str:name>/upload", ToolUploadView.as_view(), name="tool-upload"),
    path("tools/<str:name>", ToolCallView.as_view(), name="tool-call"),
    # People's notes (apps.expos.api.people); before the router's runs/ and experiments/ routes.
    path("runs/<str:key>/note/", RunNoteView.as_view(), name="run-note"),
    path("runs/<str:key>/note/versions/", RunNoteVersionsView.as_view(), name="run-note-versions"),
    path("experiments/<str:key>/note/", ExperimentNoteView.as_view(), name="experiment-note"),
    path("experiments/<str:key>/note/versions/", ExperimentNoteVersionsView.as_view(), name="experiment-note-versions"),
    path("dojo/trajectory-exports", TrajectoryExportView.as_view(), name="dojo-trajectory-exports"),
]
