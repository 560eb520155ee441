"""Revisions remember which pool each name meant (its id), so a pool registered later under a
deleted pool's name cannot inherit its weight. Existing revisions get the ids their names
have now: the best knowledge there is, and the same pools the gateways were sent."""

from django.db import migrations, models


def fill_pool_ids(apps, schema_editor):  # type: ignore[no-untyped-def]
    Pool = apps.get_model("fleet", "Pool")
    SplitRevision = apps.get_model("traffic", "SplitRevision")
    ids = dict(Pool.objects.values_list("name", "pk"))
    for revision in SplitRevision.objects.all().iterator():
        pool_ids = {name: ids[name] for name in revision.weights if name in ids}
        SplitRevision.objects.filter(pk=revision.pk).update(pool_ids=pool_ids)


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0001_initial"),
        ("traffic", "0002_pool_traffic_samples"),
    ]

    operations = [
        migrations.AddField(
            model_name="splitrevision",
            name="pool_ids",
            field=models.JSONField(default=dict),
        ),
        migrations.RunPython(fill_pool_ids, migrations.RunPython.noop),
    ]
