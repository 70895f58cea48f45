"""Control-plane URLs: the Django admin, the REST API and its OpenAPI schema."""

from django.contrib import admin
from django.urls import path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
]
