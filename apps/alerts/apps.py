from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "apps.alerts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The event log knows no listener: alerts register here (apps.experiments.events hooks).
        from apps.alerts.services import alerts_on_event  # noqa: PLC0415 - models load after apps are ready
        from apps.experiments.events import event_hook_register  # noqa: PLC0415

        event_hook_register(alerts_on_event)
