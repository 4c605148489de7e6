from django.apps import AppConfig


class IntegrityConfig(AppConfig):
    name = "apps.integrity"
    label = "integrity"
