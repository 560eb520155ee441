"""Stage 4's "Quality unchanged" check reads the `live-quality` kind (an eval made while the
plan is live, or shadow pairs from live traffic), no longer `eval`: a stage-2 eval must not
satisfy it. Existing plans' stage-4 checks that still read `eval` are moved over."""

from django.db import migrations


def forwards(apps, schema_editor):
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    for check in GateCheck.objects.filter(stage=4, key="quality", rule="evidence.latest"):
        if (check.params or {}).get("kind") == "eval":
            check.params = {**check.params, "kind": "live-quality"}
            check.save(update_fields=["params"])


def backwards(apps, schema_editor):
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    for check in GateCheck.objects.filter(stage=4, key="quality", rule="evidence.latest"):
        if (check.params or {}).get("kind") == "live-quality":
            check.params = {**check.params, "kind": "eval"}
            check.save(update_fields=["params"])


class Migration(migrations.Migration):
    dependencies = [("migrations_plan", "0003_evidence_sources_and_one_status_vocabulary")]
    operations = [migrations.RunPython(forwards, backwards)]
