"""The audit log (from tenants) and the snapshot outbox (from core) move to the base app.

State only: the tables keep their names (``tenants_auditevent`` with its append-only trigger,
``core_snapshotoutbox``) and no row moves. The content types follow the models, so admin
permissions granted on them stay granted.
"""

from typing import Any

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MOVED = (("tenants", "auditevent"), ("core", "snapshotoutbox"))


def _relabel(apps: Any, old: str, new: str, model: str) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    if not content_type.objects.filter(app_label=new, model=model).exists():
        content_type.objects.filter(app_label=old, model=model).update(app_label=new)


def forward(apps: Any, schema_editor: Any) -> None:
    for old, model in MOVED:
        _relabel(apps, old, "common", model)


def backward(apps: Any, schema_editor: Any) -> None:
    for old, model in MOVED:
        _relabel(apps, "common", old, model)


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("contenttypes", "0002_remove_content_type_name"),
        ("tenants", "0006_tenant_result_cache"),
        ("core", "0001_outbox"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="AuditEvent",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "actor_label",
                            models.CharField(
                                help_text="Who, as text: a username or 'system'.", max_length=150
                            ),
                        ),
                        ("action", models.CharField(max_length=100)),
                        ("target_type", models.CharField(max_length=100)),
                        ("target_id", models.CharField(max_length=64)),
                        ("target_repr", models.CharField(blank=True, max_length=200)),
                        ("before", models.JSONField(blank=True, null=True)),
                        ("after", models.JSONField(blank=True, null=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                        (
                            "actor",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "tenants_auditevent",
                        "ordering": ["-created_at", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="SnapshotOutbox",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("reason", models.CharField(blank=True, default="", max_length=200)),
                        ("attempts", models.PositiveIntegerField(default=0)),
                        ("last_attempt_at", models.DateTimeField(blank=True, null=True)),
                        ("last_error", models.TextField(blank=True, default="")),
                    ],
                    options={
                        "verbose_name": "snapshot outbox entry",
                        "verbose_name_plural": "snapshot outbox",
                        "ordering": ("id",),
                        "db_table": "core_snapshotoutbox",
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forward, backward),
    ]
