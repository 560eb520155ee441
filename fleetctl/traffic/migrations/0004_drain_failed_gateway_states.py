"""A drain that gives up is `failed`, with its reason stored; a gateway has no `pushing` state
(nothing ever set it)."""

from django.db import migrations, models


def pushing_to_unknown(apps, schema_editor):
    Gateway = apps.get_model("traffic", "Gateway")
    Gateway.objects.filter(state="pushing").update(state="unknown")


class Migration(migrations.Migration):

    dependencies = [
        ("traffic", "0003_revision_pool_ids"),
    ]

    operations = [
        migrations.AddField(
            model_name="drain",
            name="failure_reason",
            field=models.TextField(blank=True),
        ),
        migrations.RunPython(pushing_to_unknown, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="gateway",
            name="state",
            field=models.CharField(
                choices=[("unknown", "unknown"), ("in-sync", "in sync"), ("failing", "failing")],
                default="unknown", editable=False, max_length=10,
            ),
        ),
    ]
