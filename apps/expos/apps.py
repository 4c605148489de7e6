from django.apps import AppConfig


class ExposConfig(AppConfig):
    name = "apps.expos"
    label = "expos"
