from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "fleetctl.core"
    label = "core"
    verbose_name = "fleetctl core"
