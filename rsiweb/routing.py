"""Websocket routes; consumers live in apps.live.consumers."""

from __future__ import annotations

from django.urls import path

from apps.live.consumers import JobConsumer, RunConsumer

websocket_urlpatterns = [
    path("ws/runs/<uuid:run_uuid>/", RunConsumer.as_asgi()),
    path("ws/jobs/<uuid:job_uuid>/", JobConsumer.as_asgi()),
]
