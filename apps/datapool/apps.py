from django.apps import AppConfig


class DatapoolConfig(AppConfig):
    name = "apps.datapool"
    label = "datapool"
