"""The Batch API's routes on the control plane (``/v1/...``, reached through the router)."""

from django.urls import path

from apps.batches import api

urlpatterns = [
    path("files", api.files),
    path("files/<str:file_id>", api.file_detail),
    path("files/<str:file_id>/content", api.file_content),
    path("batches", api.batches),
    path("batches/<str:batch_id>", api.batch_detail),
    path("batches/<str:batch_id>/cancel", api.batch_cancel),
]
