from django.apps import AppConfig


class SafetyConfig(AppConfig):
    name = "apps.safety"
    label = "safety"
    verbose_name = "Safety"
