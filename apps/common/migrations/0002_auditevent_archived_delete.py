"""The audit log's retention: a DELETE passes the append-only trigger only for rows the
transaction declares archived (``SET LOCAL switchyard.archived_through = <id>``, which
apps/common/retention.py does after the batch's archive file is on disk). Everything else the
trigger refused before it still refuses."""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION tenants_auditevent_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND OLD.actor_id IS NOT NULL AND NEW.actor_id IS NULL
       AND (NEW.id, NEW.actor_label, NEW.action, NEW.target_type, NEW.target_id,
            NEW.target_repr, NEW.before, NEW.after, NEW.created_at)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.actor_label, OLD.action, OLD.target_type, OLD.target_id,
            OLD.target_repr, OLD.before, OLD.after, OLD.created_at)
    THEN
        RETURN NEW;
    END IF;
    %s
    RAISE EXCEPTION 'audit events are append-only: % of tenants_auditevent refused', TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;
"""
ARCHIVED = """IF TG_OP = 'DELETE'
       AND OLD.id <= COALESCE(
           NULLIF(current_setting('switchyard.archived_through', true), '')::bigint, 0)
    THEN
        RETURN OLD;
    END IF;"""


class Migration(migrations.Migration):
    dependencies = [
        ("common", "0001_initial"),
        ("tenants", "0002_auditevent_append_only"),
    ]

    operations = [
        migrations.RunSQL(
            sql=FUNCTION.replace("%s", ARCHIVED, 1), reverse_sql=FUNCTION.replace("%s", "", 1)
        ),
    ]
