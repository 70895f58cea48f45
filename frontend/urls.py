"""The dashboard's URLs (included at the root by ``config.urls``)."""

from django.contrib.auth import views as auth_views
from django.urls import path

from frontend import key_views, views

app_name = "dashboard"

urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(next_page="/dashboard/"), name="login"),
    path(
        "accounts/logout/",
        auth_views.LogoutView.as_view(next_page="/accounts/login/"),
        name="logout",
    ),
    path("dashboard/", views.home, name="home"),
    path("dashboard/vendor/plotly.min.js", views.plotly_js, name="plotly"),
    path("dashboard/rollouts/", views.rollouts_page, name="rollouts"),
    path("dashboard/rollouts/<int:pk>/<slug:action>/", views.rollout_action, name="rollout_action"),
    path("dashboard/scaling/", views.scaling_page, name="scaling"),
    path("dashboard/t/<slug:slug>/", views.tenant_page, name="tenant"),
    path("dashboard/t/<slug:slug>/keys/", key_views.key_create, name="key_create"),
    path(
        "dashboard/t/<slug:slug>/keys/<str:prefix>/revoke/",
        key_views.key_revoke,
        name="key_revoke",
    ),
    path("dashboard/<slug:page>/", views.operator_page, name="page"),
]
