from django.apps import AppConfig


class DojoConfig(AppConfig):
    name = "apps.dojo"
    label = "dojo"
