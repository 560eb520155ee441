"""Stage 4 gains "Routing policy holds through the gateway" (rule `routing.policy_holds`):
a probe through each route's gateways, judged by the pool that answered each request. Added to
open plans (not abandoned or completed) that have no live check of that key, after their
stage-4 checks."""

from django.db import migrations

KEY, RULE = "routing-policy", "routing.policy_holds"
TITLE = ("Routing policy holds through the gateway (each tier's prompts on its pools, pinned "
         "requests in their jurisdiction)")


def forwards(apps, schema_editor):
    Plan = apps.get_model("migrations_plan", "Plan")
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    for plan in Plan.objects.exclude(state__in=["abandoned", "completed"]):
        live = GateCheck.objects.filter(plan=plan, stage=4, removed_at__isnull=True)
        if live.filter(key=KEY).exists():
            continue
        last = live.order_by("-position").first()
        GateCheck.objects.create(plan=plan, stage=4, key=KEY, title=TITLE, kind="evidence",
                                 rule=RULE, params={"within_days": 7},
                                 position=(last.position + 1) if last else 0,
                                 added_by="template")


def backwards(apps, schema_editor):
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    GateCheck.objects.filter(stage=4, key=KEY, rule=RULE, added_by="template").delete()


class Migration(migrations.Migration):
    dependencies = [("migrations_plan", "0011_watch_held_check")]
    operations = [migrations.RunPython(forwards, backwards)]
