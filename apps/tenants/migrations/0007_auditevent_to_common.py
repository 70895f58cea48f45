"""AuditEvent moved to the base app (``common``); its table stays (state only)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0006_tenant_result_cache"),
        ("common", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="AuditEvent")],
            database_operations=[],
        ),
    ]
