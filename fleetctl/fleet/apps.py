from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleetctl.fleet"
    label = "fleet"
    verbose_name = "Fleet registry"
