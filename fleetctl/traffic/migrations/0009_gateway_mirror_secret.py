"""Each gateway gets a mirror secret of its own (traffic/mirror_auth.py).

AddField fills existing rows with one call of the default, so every existing gateway would
share one secret; the data step gives each its own."""

from typing import Any

from django.db import migrations, models

import fleetctl.traffic.mirror_auth


def secret_per_gateway(apps: Any, schema_editor: Any) -> None:
    Gateway = apps.get_model("traffic", "Gateway")
    for pk in Gateway.objects.values_list("pk", flat=True):
        Gateway.objects.filter(pk=pk).update(
            mirror_secret=fleetctl.traffic.mirror_auth.new_secret())


class Migration(migrations.Migration):

    dependencies = [
        ("traffic", "0008_health_policy"),
    ]

    operations = [
        migrations.AddField(
            model_name="gateway",
            name="mirror_secret",
            field=models.CharField(default=fleetctl.traffic.mirror_auth.new_secret,
                                   editable=False, max_length=64),
        ),
        migrations.AddField(
            model_name="gateway",
            name="mirror_secret_previous",
            field=models.CharField(blank=True, editable=False, max_length=64),
        ),
        migrations.AddField(
            model_name="gateway",
            name="mirror_secret_rotated_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(secret_per_gateway, migrations.RunPython.noop),
    ]
