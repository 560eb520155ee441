from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "fleetctl.accounts"
    label = "accounts"
    verbose_name = "People and tokens"

    def ready(self) -> None:
        from fleetctl.accounts import signals

        signals.connect()
