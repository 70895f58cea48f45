"""Control-plane URLs: the Django admin, the REST API (/api/v1/), its OpenAPI schema and docs,
the dashboard."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from apps.batches import api_rest as batches_api
from apps.billing import api as billing_api
from apps.billing import api_ops as billing_ops
from apps.core import api as core_api
from apps.models import api as models_api
from apps.models import api_signing as signing_api
from apps.rollouts import api as rollouts_api
from apps.rollouts import api_actions as rollout_actions
from apps.safety import api as safety_api
from apps.scaling import api as scaling_api
from apps.tenants import api as tenants_api
from apps.tenants import api_ops as tenants_ops
from config import ops_metrics

tenant_urls = [
    path("", tenants_api.TenantSelfApi.as_view()),
    path("entitlements/", tenants_api.EntitlementsApi.as_view()),
    path("api-keys/", tenants_api.ApiKeyListApi.as_view()),
    path("api-keys/<str:prefix>/", tenants_api.ApiKeyDetailApi.as_view()),
    path("api-keys/<str:prefix>/revoke/", tenants_api.ApiKeyRevokeApi.as_view()),
    path("api-keys/<str:prefix>/rotate/", tenants_api.ApiKeyRotateApi.as_view()),
    path("tokens/", tenants_api.ManagementTokenListApi.as_view()),
    path("tokens/<str:prefix>/revoke/", tenants_api.ManagementTokenRevokeApi.as_view()),
    path("audit/", tenants_api.TenantAuditApi.as_view()),
    path("usage/", billing_api.UsageRecordsApi.as_view()),
    path("usage/summary/", billing_api.UsageSummaryApi.as_view()),
    path("usage/export.csv", billing_api.UsageExportApi.as_view()),
    path("balance/", billing_api.BalanceApi.as_view()),
    path("grants/", billing_api.GrantListApi.as_view()),
    path("budgets/<str:period>/", billing_api.BudgetApi.as_view()),
    path("batches/", batches_api.TenantBatchListApi.as_view()),
]

ops_urls = [
    path("tenants/", tenants_ops.OpsTenantListApi.as_view()),
    path("tenants/<slug:slug>/", tenants_ops.OpsTenantDetailApi.as_view()),
    path("tenants/<slug:slug>/suspend/", tenants_ops.OpsTenantSuspendApi.as_view()),
    path("tenants/<slug:slug>/activate/", tenants_ops.OpsTenantActivateApi.as_view()),
    path("tenants/<slug:slug>/tokens/", tenants_ops.OpsTenantTokenApi.as_view()),
    path("tenants/<slug:slug>/grants/", billing_ops.OpsGrantApi.as_view()),
    path("tenants/<slug:slug>/budgets/<str:period>/", billing_ops.OpsBudgetApi.as_view()),
    path("classes/", tenants_ops.OpsClassListApi.as_view()),
    path("classes/<str:name>/", tenants_ops.OpsClassDetailApi.as_view()),
    path("models/", models_api.OpsModelListApi.as_view()),
    path("models/<int:pk>/", models_api.OpsModelDetailApi.as_view()),
    path("models/<int:pk>/versions/", models_api.OpsVersionListApi.as_view()),
    path("versions/<int:pk>/", models_api.OpsVersionDetailApi.as_view()),
    path("versions/<int:pk>/publish/", models_api.OpsVersionPublishApi.as_view()),
    path("versions/<int:pk>/signature/", signing_api.OpsVersionSignatureApi.as_view()),
    path("trusted-keys/", signing_api.OpsTrustedKeyListApi.as_view()),
    path("trusted-keys/<int:pk>/", signing_api.OpsTrustedKeyDetailApi.as_view()),
    path("pools/", models_api.OpsPoolListApi.as_view()),
    path("pools/<int:pk>/", models_api.OpsPoolDetailApi.as_view()),
    path("pools/<int:pk>/scaling/", scaling_api.OpsPoolScalingApi.as_view()),
    path("pools/<int:pk>/scaling/decisions/", scaling_api.OpsPoolScalingDecisionListApi.as_view()),
    path("endpoints/", models_api.OpsEndpointListApi.as_view()),
    path("endpoints/<int:pk>/", models_api.OpsEndpointDetailApi.as_view()),
    path("routes/", models_api.OpsRouteListApi.as_view()),
    path("routes/<int:pk>/", models_api.OpsRouteDetailApi.as_view()),
    path("prices/", billing_ops.OpsPriceListApi.as_view()),
    path("batches/", batches_api.OpsBatchListApi.as_view()),
    path("rollouts/", rollouts_api.OpsRolloutListApi.as_view()),
    path("rollouts/<int:pk>/", rollouts_api.OpsRolloutDetailApi.as_view()),
    path("rollouts/<int:pk>/cancel/", rollouts_api.OpsRolloutCancelApi.as_view()),
    *rollout_actions.rollout_action_urls(),
    path("safety/packs/", safety_api.OpsPolicyPackListApi.as_view()),
    path("safety/packs/<int:pk>/", safety_api.OpsPolicyPackDetailApi.as_view()),
    path("safety/attachments/", safety_api.OpsPolicyAttachmentListApi.as_view()),
    path("safety/attachments/<int:pk>/", safety_api.OpsPolicyAttachmentDetailApi.as_view()),
    path("safety/interventions/", safety_api.OpsInterventionListApi.as_view()),
    path("snapshot/refresh/", core_api.OpsSnapshotRefreshApi.as_view()),
    path("tasks/<str:task_id>/", core_api.OpsTaskStatusApi.as_view()),
    path("audit/", tenants_ops.OpsAuditApi.as_view()),
]

handler404 = "apps.common.api_support.not_found_handler"
handler500 = "apps.common.api_support.server_error_handler"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/me/", tenants_api.MeApi.as_view()),
    path("api/v1/tenants/<str:tenant>/", include(tenant_urls)),
    path("api/v1/ops/", include(ops_urls)),
    path("api/auth/", include("rest_framework.urls")),  # session login for tenant members
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("v1/", include("apps.batches.urls")),  # the Batch API, forwarded by the router
    path("metrics", ops_metrics.metrics),  # the background work's signals (config/ops_metrics.py)
    path("", include("frontend.urls")),  # the dashboard and its login
]
