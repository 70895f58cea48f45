"""Admin for the model registry. Every write goes through apps.models.services.

Forms call the services' validators in clean(), so invalid values come back as form errors.
A published version is shown read-only and any attempt to save it is refused with the
service's message; endpoints only change state, along the allowed transitions.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.common.admin_support import (
    ModelAdminBase,
    ModelFormBase,
    actor_of,
    add_service_errors,
    adopt,
    run_validator,
)
from apps.models.models import Endpoint, Model, ModelVersion, Pool, Route, TrustedKey
from apps.models.services import (
    endpoint_register,
    endpoint_set_state,
    endpoint_transition_validate,
    endpoint_validate,
    model_create,
    model_update,
    model_validate,
    model_version_create,
    model_version_publish,
    model_version_update,
    model_version_update_validate,
    model_version_validate,
    pool_create,
    pool_update,
    pool_validate,
    route_set,
    route_validate,
)
from apps.models.services.catalog import (
    MODEL_CACHE_FIELDS,
    MODEL_WRITABLE_FIELDS,
    VERSION_FIELDS,
    published_error,
)
from apps.models.services.fleet import POOL_FIELDS
from apps.models.services.signing import (
    trusted_key_create,
    trusted_key_set_active,
    trusted_key_validate,
)

SPLIT_RE = re.compile(r"^\s*(?P<label>[^=\s]+)\s*=\s*(?P<weight>-?\d+)\s*$")


class NoDeleteAdmin:
    """Registry rows are referenced by the data plane and the ledger; there is no delete."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- models ---------------------------------------------------------------------------------


class ModelForm(ModelFormBase[Model]):
    class Meta:
        model = Model
        fields = MODEL_WRITABLE_FIELDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["cache_ttl_s"].required = False  # blank: keep the current (or default) TTL

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("cache_ttl_s") is None and "cache_ttl_s" not in self.errors:
            cleaned["cache_ttl_s"] = self.instance.cache_ttl_s
        if not self.errors:
            run_validator(
                self,
                lambda: model_validate(
                    name=cleaned["name"],
                    task=cleaned["task"],
                    refused_fields=cleaned.get("refused_fields") or [],
                    exclude_pk=self.instance.pk,
                    cache={field: cleaned[field] for field in MODEL_CACHE_FIELDS},
                    fallback=cleaned.get("fallback"),
                    members=cleaned.get("members") or [],
                ),
            )
        return cleaned


@admin.register(Model)
class ModelAdmin(NoDeleteAdmin, ModelAdminBase[Model]):
    form = ModelForm
    list_display = ("name", "task", "fallback", "cache_enabled", "cache_shared", "cache_ttl_s",
                    "created_at")  # fmt: skip
    list_filter = ("task",)
    search_fields = ("name",)

    def save_model(self, request: HttpRequest, obj: Model, form: Any, change: bool) -> None:
        data = {field: form.cleaned_data[field] for field in MODEL_WRITABLE_FIELDS}
        data["refused_fields"] = data["refused_fields"] or []  # an empty box: refuse nothing
        data["members"] = data["members"] or []  # an empty box: not an alias
        if change:
            current = Model.objects.get(pk=obj.pk)
            model_update(actor=actor_of(request), model=current, **data)
        else:
            adopt(obj, model_create(actor=actor_of(request), **data))


# --- versions -------------------------------------------------------------------------------


class ModelVersionForm(ModelFormBase[ModelVersion]):
    class Meta:
        model = ModelVersion
        fields = ("model", *VERSION_FIELDS)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if "capabilities" in cleaned and cleaned["capabilities"] is None:
            cleaned["capabilities"] = []  # an empty box: declares nothing
        instance = self.instance
        if instance.pk is not None:
            current = ModelVersion.objects.select_related("model").get(pk=instance.pk)
            if current.is_published:
                add_service_errors(self, published_error(current))
                return cleaned
            if not self.errors:
                changes = {field: cleaned[field] for field in VERSION_FIELDS if field in cleaned}
                run_validator(
                    self, lambda: model_version_update_validate(version=current, **changes)
                )
        elif not self.errors:
            run_validator(self, lambda: model_version_validate(**cleaned))
        return cleaned


@admin.register(ModelVersion)
class ModelVersionAdmin(NoDeleteAdmin, ModelAdminBase[ModelVersion]):
    form = ModelVersionForm
    list_display = (
        "__str__",
        "runtime",
        "short_digest",
        "signing_key",
        "published_at",
        "created_at",
    )
    list_filter = ("runtime", "model")
    search_fields = ("label", "model__name", "digest")
    actions = ("publish_selected",)

    @admin.display(description="digest")
    def short_digest(self, obj: ModelVersion) -> str:
        return f"{obj.digest[:12]}…"

    def get_readonly_fields(self, request: HttpRequest, obj: ModelVersion | None = None) -> Any:
        signed = ("signing_key", "signature")  # manage.py sign_artifact or the REST API
        if obj is None:
            return ("published_at", *signed)
        if obj.is_published:
            return ("model", *VERSION_FIELDS, "published_at", *signed)  # immutable once published
        return ("model", "published_at", *signed)

    def save_model(self, request: HttpRequest, obj: ModelVersion, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if change:
            changed = {f: data[f] for f in form.changed_data if f in VERSION_FIELDS}
            current = ModelVersion.objects.get(pk=obj.pk)
            model_version_update(actor=actor_of(request), version=current, **changed)
        else:
            fields = {f: data[f] for f in ("model", *VERSION_FIELDS)}
            adopt(obj, model_version_create(actor=actor_of(request), **fields))

    @admin.action(description="Publish selected versions", permissions=["change"])
    def publish_selected(self, request: HttpRequest, queryset: QuerySet[ModelVersion]) -> None:
        for version in queryset.select_related("model"):
            try:
                model_version_publish(actor=actor_of(request), version=version)
            except ValidationError as error:
                messages.error(request, f"{version}: {'; '.join(error.messages)}")
            else:
                messages.success(request, f"Published {version}.")


# --- trusted keys ---------------------------------------------------------------------------


class TrustedKeyForm(ModelFormBase[TrustedKey]):
    public_key = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Base64 of the 32 raw bytes, or a PEM 'PUBLIC KEY' (stored as base64).",
    )

    class Meta:
        model = TrustedKey
        fields = ("name", "public_key", "active")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:  # read-only once added (the admin shows it)
            self.fields.pop("public_key", None)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.instance.pk is None and not self.errors:
            try:  # the key as stored (a PEM becomes base64), before the model's own checks
                cleaned["public_key"] = trusted_key_validate(
                    name=cleaned["name"], public_key=cleaned["public_key"]
                )
            except ValidationError as error:
                add_service_errors(self, error)
        return cleaned


@admin.register(TrustedKey)
class TrustedKeyAdmin(NoDeleteAdmin, ModelAdminBase[TrustedKey]):
    """Keys whose artifact signatures workers accept; only ``active`` changes after adding."""

    form = TrustedKeyForm
    list_display = ("name", "public_key", "active", "created_at")
    list_filter = ("active",)
    search_fields = ("name", "public_key")

    def get_readonly_fields(self, request: HttpRequest, obj: TrustedKey | None = None) -> Any:
        return () if obj is None else ("name", "public_key")

    def save_model(self, request: HttpRequest, obj: TrustedKey, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if change:
            current = TrustedKey.objects.get(pk=obj.pk)
            trusted_key_set_active(actor=actor_of(request), key=current, active=data["active"])
        else:
            fields = {f: data[f] for f in ("name", "public_key", "active")}
            adopt(obj, trusted_key_create(actor=actor_of(request), **fields))


# --- pools ----------------------------------------------------------------------------------


class PoolForm(ModelFormBase[Pool]):
    class Meta:
        model = Pool
        fields = POOL_FIELDS

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not self.errors:
            values = {field: cleaned[field] for field in POOL_FIELDS}
            run_validator(self, lambda: pool_validate(**values, exclude_pk=self.instance.pk))
        return cleaned


@admin.register(Pool)
class PoolAdmin(NoDeleteAdmin, ModelAdminBase[Pool]):
    form = PoolForm
    list_display = (
        "name",
        "hardware_tier",
        "cost_per_replica_hour",
        "min_replicas",
        "warm_replicas",
        "max_replicas",
    )
    list_filter = ("hardware_tier",)
    search_fields = ("name",)

    def save_model(self, request: HttpRequest, obj: Pool, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if change:
            changed = {f: data[f] for f in form.changed_data if f in POOL_FIELDS}
            pool_update(actor=actor_of(request), pool=Pool.objects.get(pk=obj.pk), **changed)
        else:
            adopt(obj, pool_create(actor=actor_of(request), **{f: data[f] for f in POOL_FIELDS}))


# --- endpoints ------------------------------------------------------------------------------

ENDPOINT_ADD_FIELDS = ("pool", "version", "base_url", "capacity")


class EndpointForm(ModelFormBase[Endpoint]):
    base_url = forms.CharField(max_length=300, help_text="e.g. http://10.0.0.5:8000")

    class Meta:
        model = Endpoint
        fields = (*ENDPOINT_ADD_FIELDS, "state")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "version" in self.fields:
            version_field = self.fields["version"]
            assert isinstance(version_field, forms.ModelChoiceField)
            version_field.queryset = ModelVersion.objects.select_related("model").filter(
                published_at__isnull=False
            )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            return cleaned
        if self.instance.pk is None:
            values = {field: cleaned[field] for field in ENDPOINT_ADD_FIELDS}
            run_validator(self, lambda: endpoint_validate(**values))
        else:
            current = Endpoint.objects.get(pk=self.instance.pk)
            state = cleaned["state"]
            run_validator(self, lambda: endpoint_transition_validate(endpoint=current, state=state))
        return cleaned


@admin.register(Endpoint)
class EndpointAdmin(NoDeleteAdmin, ModelAdminBase[Endpoint]):
    """Endpoints are registered here or by workers; afterwards only their state changes."""

    form = EndpointForm
    list_display = ("base_url", "pool", "version", "state", "capacity", "updated_at")
    list_filter = ("state", "pool")
    search_fields = ("base_url",)

    def get_fields(self, request: HttpRequest, obj: Endpoint | None = None) -> Any:
        return ENDPOINT_ADD_FIELDS if obj is None else (*ENDPOINT_ADD_FIELDS, "state")

    def get_readonly_fields(self, request: HttpRequest, obj: Endpoint | None = None) -> Any:
        return () if obj is None else ENDPOINT_ADD_FIELDS

    def save_model(self, request: HttpRequest, obj: Endpoint, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if change:
            current = Endpoint.objects.get(pk=obj.pk)
            endpoint_set_state(actor=actor_of(request), endpoint=current, state=data["state"])
        else:
            fields = {f: data[f] for f in ENDPOINT_ADD_FIELDS}
            adopt(obj, endpoint_register(actor=actor_of(request), **fields))


# --- routes ---------------------------------------------------------------------------------


class RouteForm(ModelFormBase[Route]):
    splits = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="One 'version-label = weight' per line, e.g. 'v1 = 90' and 'v2 = 10'. "
        "Weights are relative positive integers.",
    )

    class Meta:
        model = Route
        fields = ("model", "sticky_key")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["splits"].initial = "\n".join(
                f"{split.version.label} = {split.weight}"
                for split in self.instance.splits.select_related("version").order_by("-weight")
            )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        model = cleaned.get("model") or (self.instance.model if self.instance.pk else None)
        if self.errors or model is None:
            return cleaned
        splits: list[tuple[ModelVersion, int]] = []
        for line in filter(str.strip, cleaned["splits"].splitlines()):
            match = SPLIT_RE.match(line)
            version = (
                model.versions.filter(label=match["label"]).first() if match is not None else None
            )
            if match is None or version is None:
                message = (
                    f"{line.strip()!r}: expected 'label = weight' naming a version of {model}."
                )
                self.add_error("splits", message)
                return cleaned
            splits.append((version, int(match["weight"])))
        cleaned["parsed_splits"] = splits
        sticky_key = cleaned["sticky_key"]
        run_validator(
            self, lambda: route_validate(model=model, splits=splits, sticky_key=sticky_key)
        )
        return cleaned


@admin.register(Route)
class RouteAdmin(NoDeleteAdmin, ModelAdminBase[Route]):
    form = RouteForm
    list_display = ("model", "sticky_key", "split_summary", "updated_at")

    @admin.display(description="splits")
    def split_summary(self, obj: Route) -> str:
        return ", ".join(
            f"{split.version.label}={split.weight}"
            for split in obj.splits.select_related("version").order_by("-weight")
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Route | None = None) -> Any:
        return () if obj is None else ("model",)

    def save_model(self, request: HttpRequest, obj: Route, form: Any, change: bool) -> None:
        data = form.cleaned_data
        model = obj.model if change else data["model"]
        route = route_set(
            actor=actor_of(request),
            model=model,
            splits=data["parsed_splits"],
            sticky_key=data["sticky_key"],
        )
        adopt(obj, route)
