"""Gateway kinds come from the registry (the kind packages under traffic/gateways/), not from
choices in the database schema: adding a kind needs no migration. Values are unchanged."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("traffic", "0004_drain_failed_gateway_states"),
    ]

    operations = [
        migrations.AlterField(
            model_name="gateway",
            name="admin_address",
            field=models.CharField(
                help_text="How fleetctl reaches the gateway; each kind says what it holds (a "
                          "URL, a socket, a directory).",
                max_length=300,
                validators=[django.core.validators.RegexValidator("^\\S+$", "No spaces.")],
            ),
        ),
        migrations.AlterField(
            model_name="gateway",
            name="kind",
            field=models.CharField(default="envoy", help_text="The kind of gateway: one of the "
                                   "registered kinds.", max_length=16),
        ),
    ]
