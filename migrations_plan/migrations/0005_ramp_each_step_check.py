"""Stage 4's "Per-pool percentiles hold at each ramp step" reads every step of the newest
guarded ramp (rule `ramp.each_step`), not just the newest `ramp-slo` row: one good hold at
1 % must not pass a check about every step. Existing plans' checks are moved over."""

from django.db import migrations


def forwards(apps, schema_editor):
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    for check in GateCheck.objects.filter(stage=4, key="ramp-slo", rule="evidence.latest"):
        if (check.params or {}).get("kind") == "ramp-slo":
            days = (check.params or {}).get("within_days")
            check.rule = "ramp.each_step"
            check.params = {"within_days": days} if days is not None else {}
            check.save(update_fields=["rule", "params"])


def backwards(apps, schema_editor):
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    for check in GateCheck.objects.filter(stage=4, key="ramp-slo", rule="ramp.each_step"):
        check.rule = "evidence.latest"
        check.params = {"kind": "ramp-slo", **(check.params or {})}
        check.save(update_fields=["rule", "params"])


class Migration(migrations.Migration):
    dependencies = [("migrations_plan", "0004_live_quality_check")]
    operations = [migrations.RunPython(forwards, backwards)]
