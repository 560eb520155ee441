from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "fleetctl.audit"
    label = "audit"
    verbose_name = "Audit"
