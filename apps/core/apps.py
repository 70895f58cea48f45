from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"
    verbose_name = "Platform core"

    def ready(self) -> None:
        from django.core import checks  # noqa: PLC0415

        from config import secret_key  # noqa: PLC0415

        checks.register(secret_key.check, checks.Tags.security)
