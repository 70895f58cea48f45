from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The top app: snapshot build and publish, the demo seed, ``up``."""

    name = "apps.core"
    label = "core"
    verbose_name = "Platform core"

    def ready(self) -> None:
        from django.core import checks  # noqa: PLC0415

        from config import secret_key  # noqa: PLC0415

        checks.register(secret_key.check, checks.Tags.security)

        from apps.common.outbox import outbox_committed  # noqa: PLC0415 - apps are loaded now
        from apps.core.services import drain_after_commit  # noqa: PLC0415

        outbox_committed.connect(drain_after_commit, dispatch_uid="core.drain_after_commit")
