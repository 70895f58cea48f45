"""Admin for safety. Packs and attachments are written through apps.safety.services (the form
runs the service's validator, so a malformed rule is a form error naming the rule's field);
packs are immutable once saved (a change is a new version); interventions are read-only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.common.admin_support import actor_of, adopt, run_validator
from apps.safety.models import Intervention, PolicyAttachment, PolicyPack
from apps.safety.services import (
    attachment_create,
    attachment_delete,
    attachment_validate,
    pack_create,
    pack_next_version,
    pack_validate,
)

if TYPE_CHECKING:  # generic in django-stubs only; not subscriptable at runtime
    _PackForm = forms.ModelForm[PolicyPack]
    _AttachmentForm = forms.ModelForm[PolicyAttachment]
    _PackAdmin = admin.ModelAdmin[PolicyPack]
    _AttachmentAdmin = admin.ModelAdmin[PolicyAttachment]
    _InterventionAdmin = admin.ModelAdmin[Intervention]
else:
    _PackForm = _AttachmentForm = forms.ModelForm
    _PackAdmin = _AttachmentAdmin = _InterventionAdmin = admin.ModelAdmin


class PolicyPackForm(_PackForm):
    version = forms.IntegerField(required=False, help_text="Empty: the next version.")

    class Meta:
        model = PolicyPack
        fields = ("name", "version", "description", "rules")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not self.errors:
            name = cleaned["name"]
            number = cleaned.get("version") or pack_next_version(name)
            cleaned["version"] = number
            try:
                pack_validate(name=name, version=number, rules=cleaned.get("rules"))
            except ValidationError as error:
                for field, messages in error.message_dict.items():
                    # "rules[2].patterns[0]" shows on the rules box, naming the rule's field
                    target = field if field in self.fields else "rules"
                    self.add_error(target, [f"{field}: {m}" if target != field else m
                                            for m in messages])  # fmt: skip
        return cleaned


@admin.register(PolicyPack)
class PolicyPackAdmin(_PackAdmin):
    form = PolicyPackForm
    list_display = ("name", "version", "created_at")
    search_fields = ("name",)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return obj is None  # immutable: a change is a new version

    def save_model(self, request: HttpRequest, obj: PolicyPack, form: Any, change: bool) -> None:
        data = form.cleaned_data
        pack = pack_create(actor=actor_of(request), name=data["name"], rules=data["rules"],
                           description=data.get("description", ""),
                           version=data["version"])  # fmt: skip
        adopt(obj, pack)


class PolicyAttachmentForm(_AttachmentForm):
    class Meta:
        model = PolicyAttachment
        fields = ("pack_name", "tenant", "model")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not self.errors:
            run_validator(self, lambda: attachment_validate(
                pack_name=cleaned["pack_name"], tenant=cleaned.get("tenant"),
                model=cleaned.get("model")))  # fmt: skip
        return cleaned


@admin.register(PolicyAttachment)
class PolicyAttachmentAdmin(_AttachmentAdmin):
    form = PolicyAttachmentForm
    list_display = ("pack_name", "tenant", "model", "created_at")
    list_filter = ("pack_name",)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return obj is None

    def save_model(
        self, request: HttpRequest, obj: PolicyAttachment, form: Any, change: bool
    ) -> None:
        data = form.cleaned_data
        created = attachment_create(
            actor=actor_of(request),
            pack_name=data["pack_name"],
            tenant=data.get("tenant"),
            model=data.get("model"),
        )
        adopt(obj, created)

    def delete_model(self, request: HttpRequest, obj: PolicyAttachment) -> None:
        attachment_delete(actor=actor_of(request), attachment=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[PolicyAttachment]) -> None:
        for attachment in queryset:
            attachment_delete(actor=actor_of(request), attachment=attachment)


@admin.register(Intervention)
class InterventionAdmin(_InterventionAdmin):
    list_display = ("occurred_at", "tenant", "api_key", "model", "stage", "action", "pack",
                    "rule", "failed")  # fmt: skip
    list_filter = ("stage", "action", "pack")
    readonly_fields = [f.name for f in Intervention._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
