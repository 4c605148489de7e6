from django.apps import AppConfig


class ResearchConfig(AppConfig):
    name = "apps.research"
    label = "research"
