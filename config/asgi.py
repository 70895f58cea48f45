"""ASGI entry point of the control plane: admin, REST API, dashboard pages and websockets.

``lifespan`` starts the dashboard's live relay (routers' Redis pub/sub → channel layer);
``websocket`` serves ``/ws/live/`` with the Django session.
"""

import os

from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django_http = get_asgi_application()  # sets Django up before the consumers are imported

from config import secret_key, tls  # noqa: E402

secret_key.require()  # no SECRET_KEY outside DEBUG: refuse to serve, naming it
tls.require_serving_cert(os.environ)  # SWITCHYARD_TLS_CERT expired, mismatched: one clear line

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from frontend.lifespan import lifespan  # noqa: E402
from frontend.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_http,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
        "lifespan": lifespan,
    }
)
