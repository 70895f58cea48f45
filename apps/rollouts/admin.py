"""Admin for rollouts. Rollouts are created through apps.rollouts.services (the form runs the
service's validator, so a second active rollout for a model is a form error); they are never
edited. The buttons (one admin action per row of the actions table, apps.rollouts.actions:
start, advance, pause, resume, promote, roll back) enqueue the table's Celery task and return
at once; cancel (a draft) runs inline. Events are read-only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.common.admin_support import (
    ModelAdminBase,
    ModelFormBase,
    TabularInlineBase,
    actor_of,
    adopt,
    run_validator,
)
from apps.models.models import ModelVersion
from apps.rollouts.actions import RolloutAction, operator_actions
from apps.rollouts.models import Rollout, RolloutEvent
from apps.rollouts.services import (
    DEFAULT_STEPS,
    EVENT_FIELDS,
    ROLLOUT_RULE_FIELDS,
    rollout_cancel,
    rollout_create,
    rollout_validate,
)
from apps.rollouts.tasks import rollout_action_queue

CREATE_FIELDS = (
    "model",
    "stable_version",
    "candidate_version",
    "mode",
    "steps",
    *ROLLOUT_RULE_FIELDS,
)


class RolloutCreateForm(ModelFormBase[Rollout]):
    class Meta:
        model = Rollout
        fields = CREATE_FIELDS
        help_texts = {
            "steps": "Candidate traffic percentages. Canary: increasing, ending at 100, e.g. "
            "[1, 5, 25, 50, 100]. A/B: one share below 100, e.g. [50]. Shadow: the mirrored "
            "share, e.g. [10].",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        published = ModelVersion.objects.select_related("model").filter(published_at__isnull=False)
        for name in ("stable_version", "candidate_version"):
            field = self.fields[name]
            assert isinstance(field, forms.ModelChoiceField)
            field.queryset = published
        self.fields["steps"].initial = list(DEFAULT_STEPS)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not self.errors:
            values = {field: cleaned[field] for field in CREATE_FIELDS}
            run_validator(self, lambda: rollout_validate(**values))
        return cleaned


class RolloutEventInline(TabularInlineBase[RolloutEvent, Rollout]):
    model = RolloutEvent
    fields = EVENT_FIELDS
    readonly_fields = EVENT_FIELDS
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Rollout)
class RolloutAdmin(ModelAdminBase[Rollout]):
    add_form = RolloutCreateForm
    list_display = ("__str__", "mode", "steps", "current_step", "state", "created_by", "created_at")
    list_filter = ("state", "mode", "model")
    readonly_fields = (
        *CREATE_FIELDS,
        "state",
        "current_step",
        "step_started_at",
        "warmup_endpoints",
        "created_by",
        "created_at",
    )
    inlines = (RolloutEventInline,)

    def get_form(
        self, request: HttpRequest, obj: Rollout | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = self.add_form
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Rollout | None = None) -> Any:
        return CREATE_FIELDS if obj is None else self.readonly_fields

    def get_readonly_fields(self, request: HttpRequest, obj: Rollout | None = None) -> Any:
        return () if obj is None else self.readonly_fields

    def get_inlines(self, request: HttpRequest, obj: Rollout | None) -> Any:
        return self.inlines if obj is not None else ()

    def has_change_permission(self, request: HttpRequest, obj: Rollout | None = None) -> bool:
        # The list (and its actions) needs change permission; a single rollout is never edited.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Rollout | None = None) -> bool:
        return False  # the history stays; cancel instead

    def save_model(self, request: HttpRequest, obj: Rollout, form: Any, change: bool) -> None:
        if change:
            return
        values = {field: form.cleaned_data[field] for field in CREATE_FIELDS}
        adopt(obj, rollout_create(actor=actor_of(request), **values))

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        """Django's actions plus one ``<name>_selected`` per row of the actions table."""
        actions: dict[str, Any] = super().get_actions(request)
        if not self.has_change_permission(request):
            return actions
        for action in operator_actions().values():
            name = f"{action.name}_selected"
            description = f"{action.label} selected rollouts: {action.description()}"
            actions[name] = (_table_action(action), name, description.replace("%", "%%"))
        return actions


def _table_action(action: RolloutAction) -> Callable[[Any, HttpRequest, QuerySet[Rollout]], None]:
    """An admin action for a row of the actions table: queue its task for each selected rollout
    it may start from, or (cancel, no task) call its service in the request."""

    def run(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Rollout]) -> None:
        actor = actor_of(request)
        reason = f"{action.done.capitalize()} in the admin by {request.user}."
        if action.task is None:
            for rollout in queryset.filter(state__in=action.states):
                try:
                    rollout_cancel(actor=actor, rollout=rollout, reason=reason)
                except ValidationError as error:
                    messages.error(request, f"Rollout #{rollout.pk}: {'; '.join(error.messages)}")
                else:
                    messages.success(request, f"{action.done.capitalize()} rollout #{rollout.pk}.")
            return
        for rollout in queryset:
            if not action.enabled_in(rollout.state):
                refusal = f"Rollout #{rollout.pk} is {rollout.state}; it cannot be {action.done}."
                messages.error(request, refusal)
                continue
            rollout_action_queue(
                action, rollout_id=rollout.pk, actor_id=actor.pk if actor else None, reason=reason
            )
            messages.success(request, f"Rollout #{rollout.pk}: {action.done} requested.")

    return run


@admin.register(RolloutEvent)
class RolloutEventAdmin(ModelAdminBase[RolloutEvent]):
    """Read-only: the event log of every rollout transition (who and why)."""

    list_display = (
        "created_at",
        "rollout",
        "kind",
        "from_state",
        "to_state",
        "step",
        "actor_label",
    )
    list_filter = ("kind",)
    readonly_fields = ("rollout", *EVENT_FIELDS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: RolloutEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: RolloutEvent | None = None) -> bool:
        return False
