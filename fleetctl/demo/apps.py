from django.apps import AppConfig


class DemoConfig(AppConfig):
    """Installed only for its `demo_seed` management command."""

    name = "fleetctl.demo"
    label = "demo"
    verbose_name = "Demo stack"
