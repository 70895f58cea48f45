"""SnapshotOutbox moved to the base app (``common``); its table stays (state only)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0001_outbox"),
        ("common", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="SnapshotOutbox")],
            database_operations=[],
        ),
    ]
