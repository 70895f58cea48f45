from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "apps.models"
    label = "registry"
    verbose_name = "Model registry"
