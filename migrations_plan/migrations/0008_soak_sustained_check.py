"""Stage 3's soak check measures the soak on the clock (rule `soak.sustained`: its jobs
covered at least N days, none missed), not just the newest soak row's verdict: an 8-minute
soak must not pass "a soak of N days". Existing plans' checks are moved over, asking 7 days."""

from django.db import migrations

OLD_TITLE = "Batch soak of N days with no manual intervention"
NEW_TITLE = "Batch soak of 7 days with no manual intervention"


def forwards(apps, schema_editor):
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    for check in GateCheck.objects.filter(stage=3, key="soak", rule="evidence.latest"):
        if (check.params or {}).get("kind") == "soak":
            days = (check.params or {}).get("within_days")
            check.rule = "soak.sustained"
            check.params = {"min_days": 7, **({"within_days": days} if days else {})}
            if check.title == OLD_TITLE:
                check.title = NEW_TITLE
            check.save(update_fields=["rule", "params", "title"])


def backwards(apps, schema_editor):
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    for check in GateCheck.objects.filter(stage=3, key="soak", rule="soak.sustained"):
        days = (check.params or {}).get("within_days")
        check.rule = "evidence.latest"
        check.params = {"kind": "soak", **({"within_days": days} if days else {})}
        if check.title == NEW_TITLE:
            check.title = OLD_TITLE
        check.save(update_fields=["rule", "params", "title"])


class Migration(migrations.Migration):
    dependencies = [("migrations_plan", "0007_plan_at_risk")]
    operations = [migrations.RunPython(forwards, backwards)]
