"""Stage 4 gains "Per-pool percentiles held for 7 days" (rule `watch.held`): the standing
live watch that follows a completed ramp, measured from its verdict rows. Added to open plans
(not abandoned or completed) that have no live check of that key, after their stage-4
checks."""

from django.db import migrations

KEY, TITLE, RULE = "watch-held", "Per-pool percentiles held for 7 days", "watch.held"


def forwards(apps, schema_editor):
    Plan = apps.get_model("migrations_plan", "Plan")
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    for plan in Plan.objects.exclude(state__in=["abandoned", "completed"]):
        live = GateCheck.objects.filter(plan=plan, stage=4, removed_at__isnull=True)
        if live.filter(key=KEY).exists():
            continue
        last = live.order_by("-position").first()
        GateCheck.objects.create(plan=plan, stage=4, key=KEY, title=TITLE, kind="evidence",
                                 rule=RULE, params={"min_days": 7},
                                 position=(last.position + 1) if last else 0,
                                 added_by="template")


def backwards(apps, schema_editor):
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    GateCheck.objects.filter(stage=4, key=KEY, rule=RULE, added_by="template").delete()


class Migration(migrations.Migration):
    dependencies = [("migrations_plan", "0010_check_history")]
    operations = [migrations.RunPython(forwards, backwards)]
