"""Control-plane URLs: the Django admin, the REST API and its OpenAPI schema, the dashboard."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("", include("frontend.urls")),  # the dashboard and its login
]
