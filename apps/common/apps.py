from django.apps import AppConfig


class CommonConfig(AppConfig):
    """The shared base every feature app builds on; it imports no feature app."""

    name = "apps.common"
    label = "common"
    verbose_name = "Platform base"
