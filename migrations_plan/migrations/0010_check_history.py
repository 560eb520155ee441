"""Each gate check keeps a history of its statuses (`CheckStatusChange`, written by the
plan refresh), back-filled from the audit log's `plan.check.status` records and, for a check
with none, its last status. Stage 1 gains "Candidate and primary serve the same weights
revision" (rule `models.same_revision`) on open plans. Stage 4's quality check is retitled:
it reads live traffic (a stage-4 shadow run), never an eval run."""

import re

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

STAGE = re.compile(r"^stage (\d):")
SAME_REVISION = ("same-revision", "Candidate and primary serve the same weights revision",
                 "models.same_revision")


def backfill(apps, schema_editor):
    AuditEvent = apps.get_model("audit", "AuditEvent")
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    Change = apps.get_model("migrations_plan", "CheckStatusChange")
    rows = []
    seen: set[int] = set()
    events = AuditEvent.objects.filter(action="plan.check.status",
                                       object_type="migrations_plan.plan").order_by("at", "id")
    for event in events.iterator():
        after = event.after or {}
        match = STAGE.match(event.message or "")
        if not after.get("check") or not after.get("status") or not match:
            continue
        check = (GateCheck.objects.filter(plan_id=event.object_id, stage=int(match[1]),
                                          key=after["check"], added_at__lte=event.at)
                 .exclude(removed_at__lt=event.at).order_by("-added_at").first())
        if check is None:
            continue
        summary = event.message.split(": ", 2)[-1] if event.message.count(": ") >= 2 else ""
        rows.append(Change(check_item_id=check.pk, status=after["status"], at=event.at,
                           summary=summary[:300]))
        seen.add(check.pk)
    for check in GateCheck.objects.exclude(last_status="").exclude(pk__in=seen) \
            .filter(last_status_at__isnull=False):
        rows.append(Change(check_item_id=check.pk, status=check.last_status,
                           at=check.last_status_at, summary=""))
    Change.objects.bulk_create(rows, batch_size=500)


OLD_QUALITY = "Quality unchanged (eval on live traffic)"
NEW_QUALITY = "Quality unchanged on live traffic (shadow of live requests)"


def retitle_quality(apps, schema_editor, old=OLD_QUALITY, new=NEW_QUALITY):
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    GateCheck.objects.filter(stage=4, key="quality", title=old).update(title=new)


def untitle_quality(apps, schema_editor):
    retitle_quality(apps, schema_editor, old=NEW_QUALITY, new=OLD_QUALITY)


def add_same_revision(apps, schema_editor):
    Plan = apps.get_model("migrations_plan", "Plan")
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    key, title, rule = SAME_REVISION
    for plan in Plan.objects.exclude(state__in=["abandoned", "completed"]):
        live = GateCheck.objects.filter(plan=plan, stage=1, removed_at__isnull=True)
        if live.filter(key=key).exists():
            continue
        last = live.order_by("-position").first()
        GateCheck.objects.create(plan=plan, stage=1, key=key, title=title, kind="evidence",
                                 rule=rule, params={}, position=(last.position + 1) if last
                                 else 0, added_by="template")


def remove_same_revision(apps, schema_editor):
    GateCheck = apps.get_model("migrations_plan", "GateCheck")
    GateCheck.objects.filter(stage=1, key=SAME_REVISION[0], rule=SAME_REVISION[2],
                             added_by="template").delete()


class Migration(migrations.Migration):

    dependencies = [
        ('migrations_plan', '0009_plan_slo_e2e'),
        ('audit', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='CheckStatusChange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('status', models.CharField(max_length=20)),
                ('at', models.DateTimeField(default=django.utils.timezone.now)),
                ('summary', models.CharField(blank=True, max_length=300)),
                ('check_item', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='history', to='migrations_plan.gatecheck')),
            ],
            options={
                'ordering': ['-at', '-id'],
                'indexes': [models.Index(fields=['check_item', '-at'], name='migrations__check_i_82b5c0_idx')],
            },
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.RunPython(add_same_revision, remove_same_revision),
        migrations.RunPython(retitle_quality, untitle_quality),
    ]
