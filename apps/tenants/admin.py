"""Admin for the tenants app. Every write goes through apps.tenants.services.

Forms call the services' validators in clean(), so invalid values come back as form errors;
save_model / delete_model call the services, which write the audit log and publish the
runtime snapshot.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.validators import MinValueValidator
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.common.admin_support import ModelAdminBase, ModelFormBase, actor_of, adopt
from apps.tenants.models import ApiKey, Membership, RequestClass, Tenant
from apps.tenants.services import (
    API_KEY_SCOPES,
    REQUEST_CLASS_FIELDS,
    TENANT_LIMIT_FIELDS,
    TENANT_UPDATABLE_FIELDS,
    api_key_create,
    api_key_revoke,
    api_key_validate_values,
    membership_create,
    membership_delete,
    membership_update_role,
    membership_validate_values,
    request_class_create,
    request_class_update,
    request_class_validate_values,
    tenant_activate,
    tenant_create,
    tenant_suspend,
    tenant_update,
    tenant_validate_values,
)


def _leave_minimum_to_service(form: forms.BaseForm, fields: tuple[str, ...], minimum: int) -> None:
    """Drop the form fields' own lower bound (0 for Positive*Field) so the service's validator
    reports out-of-range values with one clear message; the widget still hints `minimum`."""
    for name in fields:
        field = form.fields[name]
        field.validators = [v for v in field.validators if not isinstance(v, MinValueValidator)]
        field.widget.attrs["min"] = minimum


class RequestClassForm(ModelFormBase[RequestClass]):
    class Meta:
        model = RequestClass
        fields = REQUEST_CLASS_FIELDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        fields = ("ttft_slo_ms", "deadline_ms", "max_queue_length", "itl_slo_ms")
        _leave_minimum_to_service(self, fields, 1)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        request_class_validate_values(cleaned)
        return cleaned


@admin.register(RequestClass)
class RequestClassAdmin(ModelAdminBase[RequestClass]):
    form = RequestClassForm
    list_display = REQUEST_CLASS_FIELDS

    def has_delete_permission(self, request: HttpRequest, obj: RequestClass | None = None) -> bool:
        return False  # classes are referenced by tenants and the data plane; no delete service

    def save_model(self, request: HttpRequest, obj: RequestClass, form: Any, change: bool) -> None:
        data = {field: form.cleaned_data[field] for field in REQUEST_CLASS_FIELDS}
        if change:
            current = RequestClass.objects.get(pk=obj.pk)
            request_class_update(actor=actor_of(request), request_class=current, **data)
        else:
            adopt(obj, request_class_create(actor=actor_of(request), **data))


class TenantForm(ModelFormBase[Tenant]):
    class Meta:
        model = Tenant
        fields = ("slug", "name", "status", "weight", "rpm_limit", "tpm_limit",
                  "max_concurrency", "max_context_tokens", "max_output_tokens",
                  "max_request_bytes", "result_cache", "zero_retention",
                  "batch_file_retention_days", "allowed_classes", "default_class",
                  "allowed_models")  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _leave_minimum_to_service(self, TENANT_LIMIT_FIELDS, 1)
        self.fields["max_request_bytes"].required = False  # blank: 0, no cap of its own

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("max_request_bytes") is None and "max_request_bytes" not in self.errors:
            cleaned["max_request_bytes"] = 0
        tenant_validate_values(cleaned)
        return cleaned


@admin.register(Tenant)
class TenantAdmin(ModelAdminBase[Tenant]):
    form = TenantForm
    list_display = ("slug", "name", "status", "weight", "rpm_limit", "tpm_limit",
                    "max_concurrency", "default_class")  # fmt: skip
    list_filter = ("status",)
    search_fields = ("slug", "name")
    filter_horizontal = ("allowed_classes", "allowed_models")
    actions = ("suspend_selected", "activate_selected")

    def get_readonly_fields(self, request: HttpRequest, obj: Tenant | None = None) -> Any:
        return ("slug",) if obj is not None else ()  # the slug is the tenant's identity

    def has_delete_permission(self, request: HttpRequest, obj: Tenant | None = None) -> bool:
        return False  # tenants are suspended, not deleted (usage and billing refer to them)

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if change:
            fields = [f for f in form.changed_data if f in TENANT_UPDATABLE_FIELDS]
            if fields:
                current = Tenant.objects.get(pk=obj.pk)
                changes = {f: data[f] for f in fields}
                tenant_update(actor=actor_of(request), tenant=current, **changes)
        else:
            tenant = tenant_create(
                actor=actor_of(request),
                **{f: data[f] for f in ("slug", *sorted(TENANT_UPDATABLE_FIELDS - {"status"}))},
            )
            if data.get("status") == Tenant.Status.SUSPENDED:
                tenant = tenant_suspend(actor=actor_of(request), tenant=tenant)
            adopt(obj, tenant)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """allowed_classes was written by the service; the form must not write it again."""

    @admin.action(description="Suspend selected tenants", permissions=["change"])
    def suspend_selected(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        done = [
            tenant_suspend(actor=actor_of(request), tenant=t).slug
            for t in queryset.filter(status=Tenant.Status.ACTIVE)
        ]
        messages.success(request, f"Suspended {len(done)} tenant(s): {', '.join(done) or '-'}.")

    @admin.action(description="Activate selected tenants", permissions=["change"])
    def activate_selected(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        done = [
            tenant_activate(actor=actor_of(request), tenant=t).slug
            for t in queryset.filter(status=Tenant.Status.SUSPENDED)
        ]
        messages.success(request, f"Activated {len(done)} tenant(s): {', '.join(done) or '-'}.")


class ApiKeyCreateForm(ModelFormBase[ApiKey]):
    scopes = forms.MultipleChoiceField(
        choices=[(scope, scope) for scope in API_KEY_SCOPES],
        initial=["inference"],
        widget=forms.CheckboxSelectMultiple,
    )

    class Meta:
        model = ApiKey
        fields = ("tenant", "name", "scopes", "expires_at")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        api_key_validate_values(cleaned)
        return cleaned


@admin.register(ApiKey)
class ApiKeyAdmin(ModelAdminBase[ApiKey]):
    """Keys are created here (the full key is shown once) and revoked; never edited."""

    add_form = ApiKeyCreateForm
    list_display = ("prefix", "name", "tenant", "scopes", "expires_at", "revoked_at",
                    "last_used_at", "created_at")  # fmt: skip
    list_filter = ("tenant",)
    search_fields = ("prefix", "name", "tenant__slug")
    readonly_fields = ("tenant", "name", "prefix", "digest", "scopes", "expires_at",
                       "revoked_at", "last_used_at", "created_at")  # fmt: skip
    actions = ("revoke_selected",)

    def get_form(
        self, request: HttpRequest, obj: ApiKey | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = self.add_form
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        return self.readonly_fields if obj is not None else ()

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        return self.readonly_fields if obj is not None else ApiKeyCreateForm.Meta.fields

    def has_change_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return False  # immutable; use the revoke action

    def has_delete_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return False  # revoke instead, so usage keeps its key

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("tenants.change_apikey")

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            return
        data = form.cleaned_data
        api_key, full_key = api_key_create(
            actor=actor_of(request),
            tenant=data["tenant"],
            name=data["name"],
            scopes=data["scopes"],
            expires_at=data.get("expires_at"),
        )
        adopt(obj, api_key)
        messages.success(
            request,
            f"New API key for {api_key.tenant.slug}: {full_key} — copy it now; "
            "it is stored only as a digest and will not be shown again.",
        )

    @admin.action(description="Revoke selected keys", permissions=["revoke"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = [
            api_key_revoke(actor=actor_of(request), api_key=key).prefix
            for key in queryset.filter(revoked_at__isnull=True)
        ]
        skipped = queryset.count() - len(revoked)
        note = f" ({skipped} already revoked, left as they were)" if skipped else ""
        messages.success(request, f"Revoked {len(revoked)} key(s){note}.")


class MembershipForm(ModelFormBase[Membership]):
    class Meta:
        model = Membership
        fields = ("user", "tenant", "role")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        membership_validate_values(cleaned)
        return cleaned


@admin.register(Membership)
class MembershipAdmin(ModelAdminBase[Membership]):
    form = MembershipForm
    list_display = ("user", "tenant", "role", "created_at")
    list_filter = ("role", "tenant")
    search_fields = ("user__username", "tenant__slug")

    def get_readonly_fields(self, request: HttpRequest, obj: Membership | None = None) -> Any:
        return ("user", "tenant") if obj is not None else ()

    def save_model(self, request: HttpRequest, obj: Membership, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if change:
            current = Membership.objects.select_related("user", "tenant").get(pk=obj.pk)
            membership_update_role(actor=actor_of(request), membership=current, role=data["role"])
        else:
            membership = membership_create(
                actor=actor_of(request), user=data["user"], tenant=data["tenant"], role=data["role"]
            )
            adopt(obj, membership)

    def delete_model(self, request: HttpRequest, obj: Membership) -> None:
        membership_delete(actor=actor_of(request), membership=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        for membership in queryset.select_related("user", "tenant"):
            membership_delete(actor=actor_of(request), membership=membership)
