"""Websocket routes; the consumers live beside the pages they feed, in apps.dashboard.consumers."""

from __future__ import annotations

from django.urls import path

from apps.dashboard.consumers import JobConsumer, RunConsumer

websocket_urlpatterns = [
    path("ws/runs/<uuid:run_uuid>/", RunConsumer.as_asgi()),
    path("ws/jobs/<uuid:job_uuid>/", JobConsumer.as_asgi()),
]
