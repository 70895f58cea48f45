"""Actuators: what carries out a scaling plan (local processes or a Kubernetes Deployment)."""

from apps.scaling.actuators.base import Actuation, Actuator, ActuatorError, Replicas

__all__ = ["Actuation", "Actuator", "ActuatorError", "Replicas"]
