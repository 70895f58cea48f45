"""ASGI entry point of the control plane (admin, REST API, later the dashboard's websockets)."""

import os

from channels.routing import ProtocolTypeRouter
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

application = ProtocolTypeRouter({"http": get_asgi_application()})
