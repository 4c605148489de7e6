from django.apps import AppConfig


class IntegrityConfig(AppConfig):
    name = "apps.integrity"
    label = "integrity"

    def ready(self) -> None:
        # workers/ is autodiscovered by Celery, Django apps are not: import the integrity task here
        # so every worker process registers it.
        from apps.integrity import tasks  # noqa: F401
