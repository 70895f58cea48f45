"""Make the audit log append-only in the database itself.

A trigger refuses every UPDATE and DELETE of tenants_auditevent, whatever the client (the
ORM, a raw cursor, psql). One update is let through: setting actor_id to NULL and nothing
else, which is what ON DELETE SET NULL does when the acting user is deleted (actor_label
keeps who it was). TRUNCATE is not blocked: test-database flushes use it.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION tenants_auditevent_append_only() RETURNS trigger
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
    RAISE EXCEPTION 'audit events are append-only: % of tenants_auditevent refused', TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;

CREATE TRIGGER tenants_auditevent_append_only
    BEFORE UPDATE OR DELETE ON tenants_auditevent
    FOR EACH ROW EXECUTE FUNCTION tenants_auditevent_append_only();
"""

REVERSE = """
DROP TRIGGER IF EXISTS tenants_auditevent_append_only ON tenants_auditevent;
DROP FUNCTION IF EXISTS tenants_auditevent_append_only();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0001_initial"),
    ]

    operations = [
        migrations.RunSQL(sql=FORWARD, reverse_sql=REVERSE),
    ]
