"""Refuse UPDATE and DELETE of audit rows in the database itself (PostgreSQL and SQLite)."""

from django.db import migrations

PG_UP = """
CREATE OR REPLACE FUNCTION audit_event_append_only() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'audit_auditevent is append-only: %% refused', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_event_no_update BEFORE UPDATE ON audit_auditevent
  FOR EACH ROW EXECUTE FUNCTION audit_event_append_only();
CREATE TRIGGER audit_event_no_delete BEFORE DELETE ON audit_auditevent
  FOR EACH ROW EXECUTE FUNCTION audit_event_append_only();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS audit_event_no_update ON audit_auditevent;
DROP TRIGGER IF EXISTS audit_event_no_delete ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_event_append_only();
"""
SQLITE_UP = [
    "CREATE TRIGGER audit_event_no_update BEFORE UPDATE ON audit_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit_auditevent is append-only: UPDATE refused'); END;",
    "CREATE TRIGGER audit_event_no_delete BEFORE DELETE ON audit_auditevent "
    "BEGIN SELECT RAISE(ABORT, 'audit_auditevent is append-only: DELETE refused'); END;",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS audit_event_no_update;",
    "DROP TRIGGER IF EXISTS audit_event_no_delete;",
]


def forwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_UP)
    elif vendor == "sqlite":
        for statement in SQLITE_UP:
            schema_editor.execute(statement)


def backwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_DOWN)
    elif vendor == "sqlite":
        for statement in SQLITE_DOWN:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
