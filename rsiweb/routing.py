"""Websocket routes; consumers live in apps.live."""

from __future__ import annotations

websocket_urlpatterns: list = []
