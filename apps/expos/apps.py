from django.apps import AppConfig


class ExposConfig(AppConfig):
    name = "apps.expos"
    label = "expos"

    def ready(self) -> None:
        # Registers the bearer-token scheme with drf-spectacular (an import side effect by design).
        from apps.expos import openapi  # noqa: F401, PLC0415 - once the app registry is ready
