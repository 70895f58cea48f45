"""Reads of the Batch API's batches for the REST lists and the dashboard."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.batches.models import Batch
from apps.tenants.models import Tenant

RUNNING = (Batch.Status.VALIDATING, Batch.Status.IN_PROGRESS, Batch.Status.FINALIZING,
           Batch.Status.CANCELLING)  # fmt: skip


def batches_listed(
    *, tenant: Tenant | str | None = None, status: str | None = None
) -> QuerySet[Batch]:
    """Batches, newest first: of one tenant (a tenant or its slug) and in one status, when
    given."""
    found = Batch.objects.select_related("tenant", "input_file", "output_file", "error_file")
    if isinstance(tenant, Tenant):
        found = found.filter(tenant=tenant)
    elif tenant:
        found = found.filter(tenant__slug=tenant)
    if status:
        found = found.filter(status=status)
    return found.order_by("-id")


def batch_progress(batch: Batch) -> float:
    """The share of the batch's lines that have finished (answered or failed), 0..1."""
    if batch.total <= 0:
        return 1.0 if batch.status not in RUNNING else 0.0
    return min(1.0, (batch.completed + batch.failed) / batch.total)
