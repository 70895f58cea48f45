from django.apps import AppConfig


class ScalingConfig(AppConfig):
    name = "apps.scaling"
    label = "scaling"
    verbose_name = "Autoscaling"
