from django.apps import AppConfig


class XdsConfig(AppConfig):
    name = "fleetctl.xds"
    label = "xds"
    verbose_name = "xDS control plane"
