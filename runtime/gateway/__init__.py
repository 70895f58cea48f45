"""The router's wire: Channels consumers speaking the OpenAI HTTP API and SSE.

The only runtime package that imports Channels, ``django.conf`` and HTTP details. The ASGI
application is built by :func:`runtime.gateway.app.create_app`; ``python -m runtime.gateway``
serves it with uvicorn (uvloop, httptools).
"""
