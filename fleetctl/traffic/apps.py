from django.apps import AppConfig


class TrafficConfig(AppConfig):
    name = "fleetctl.traffic"
    label = "traffic"
    verbose_name = "Traffic"
