"""The dashboard's websocket routes (mounted by ``config.asgi``)."""

from django.urls import path

from frontend.consumers import LiveConsumer

websocket_urlpatterns = [path("ws/live/", LiveConsumer.as_asgi())]
