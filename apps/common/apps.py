from django.apps import AppConfig


class CommonConfig(AppConfig):
    """The shared base every feature app builds on; it imports no feature app."""

    name = "apps.common"
    label = "common"
    verbose_name = "Platform base"

    def ready(self) -> None:
        from django.core import checks  # noqa: PLC0415

        from apps.common.retention import retention_check  # noqa: PLC0415

        checks.register(retention_check)
