"""Live-update plumbing only: the publisher (``events``), group names (``groups``) and channel layers
(``layers``). The websocket consumers live beside the pages they feed (apps.dashboard.consumers);
the services of each domain app publish (STYLE.md 23-25)."""

from django.apps import AppConfig


class LiveConfig(AppConfig):
    name = "apps.live"
    label = "live"
