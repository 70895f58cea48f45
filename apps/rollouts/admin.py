"""Admin for rollouts. Rollouts are created through apps.rollouts.services (the form runs the
service's validator, so a second active rollout for a model is a form error); they are never
edited. The buttons (actions: start, advance, pause, resume, promote, roll back) enqueue the
Celery tasks of apps.rollouts.tasks and return at once; cancel (a draft) runs inline. Events
are read-only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.common.admin_support import actor_of, adopt, run_validator
from apps.models.models import ModelVersion
from apps.rollouts import tasks
from apps.rollouts.models import Rollout, RolloutEvent
from apps.rollouts.services import (
    CANCELLABLE_STATES,
    DEFAULT_STEPS,
    rollout_cancel,
    rollout_create,
    rollout_validate,
)

if TYPE_CHECKING:  # generic in django-stubs only; not subscriptable at runtime
    _RolloutForm = forms.ModelForm[Rollout]
    _RolloutAdmin = admin.ModelAdmin[Rollout]
    _EventAdmin = admin.ModelAdmin[RolloutEvent]
    _EventInline = admin.TabularInline[RolloutEvent, Rollout]
else:
    _RolloutForm = forms.ModelForm
    _RolloutAdmin = _EventAdmin = admin.ModelAdmin
    _EventInline = admin.TabularInline

CREATE_FIELDS = (
    "model",
    "stable_version",
    "candidate_version",
    "mode",
    "steps",
    "max_error_rate_delta",
    "max_ttft_p95_ratio",
    "max_itl_p95_ratio",
    "max_cost_ratio",
    "step_window_s",
    "min_samples",
    "max_step_increase",
    "excluded_tenants",
    "sticky_header",
)
EVENT_FIELDS = (
    "created_at",
    "kind",
    "from_state",
    "to_state",
    "step",
    "actor_label",
    "reason",
    "data",
)


class RolloutCreateForm(_RolloutForm):
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


class RolloutEventInline(_EventInline):
    model = RolloutEvent
    fields = EVENT_FIELDS
    readonly_fields = EVENT_FIELDS
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Rollout)
class RolloutAdmin(_RolloutAdmin):
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
    actions = (
        "start_selected",
        "advance_selected",
        "pause_selected",
        "resume_selected",
        "promote_selected",
        "rollback_selected",
        "cancel_selected",
    )

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

    @admin.action(description="Cancel selected rollouts", permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Rollout]) -> None:
        reason = f"Cancelled in the admin by {request.user}."
        for rollout in queryset.filter(state__in=CANCELLABLE_STATES):
            try:
                rollout_cancel(actor=actor_of(request), rollout=rollout, reason=reason)
            except ValidationError as error:
                messages.error(request, f"Rollout #{rollout.pk}: {'; '.join(error.messages)}")
            else:
                messages.success(request, f"Cancelled rollout #{rollout.pk}.")

    def _enqueue(
        self,
        request: HttpRequest,
        queryset: QuerySet[Rollout],
        *,
        states: tuple[str, ...],
        what: str,
        send: Any,
    ) -> None:
        actor = actor_of(request)
        actor_id = actor.pk if actor is not None else None
        for rollout in queryset:
            if rollout.state not in states:
                messages.error(
                    request, f"Rollout #{rollout.pk} is {rollout.state}; it cannot be {what}."
                )
                continue
            send(rollout.pk, actor_id)
            messages.success(request, f"Rollout #{rollout.pk}: {what} requested.")

    @admin.action(
        description="Start selected rollouts (warm up, then step 1)", permissions=["change"]
    )
    def start_selected(self, request: HttpRequest, queryset: QuerySet[Rollout]) -> None:
        self._enqueue(
            request, queryset, states=("pending",), what="started",
            send=tasks.rollout_start.delay,
        )  # fmt: skip

    @admin.action(description="Advance selected rollouts one step", permissions=["change"])
    def advance_selected(self, request: HttpRequest, queryset: QuerySet[Rollout]) -> None:
        reason = f"Advanced in the admin by {request.user}."
        self._enqueue(
            request, queryset, states=("running",), what="advanced",
            send=lambda pk, actor: tasks.rollout_advance.delay(pk, actor, reason),
        )  # fmt: skip

    @admin.action(description="Pause selected rollouts", permissions=["change"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[Rollout]) -> None:
        reason = f"Paused in the admin by {request.user}."
        self._enqueue(
            request, queryset, states=("running",), what="paused",
            send=lambda pk, actor: tasks.rollout_pause.delay(pk, actor, reason),
        )  # fmt: skip

    @admin.action(description="Resume selected rollouts", permissions=["change"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Rollout]) -> None:
        self._enqueue(
            request, queryset, states=("paused",), what="resumed",
            send=tasks.rollout_resume.delay,
        )  # fmt: skip

    @admin.action(
        description="Promote selected rollouts (candidate 100 %%)", permissions=["change"]
    )
    def promote_selected(self, request: HttpRequest, queryset: QuerySet[Rollout]) -> None:
        reason = f"Promoted in the admin by {request.user}."
        self._enqueue(
            request, queryset, states=("running", "paused"), what="promoted",
            send=lambda pk, actor: tasks.rollout_promote.delay(pk, actor, reason),
        )  # fmt: skip

    @admin.action(description="Roll back selected rollouts (stable 100 %%)", permissions=["change"])
    def rollback_selected(self, request: HttpRequest, queryset: QuerySet[Rollout]) -> None:
        reason = f"Rolled back in the admin by {request.user}."
        self._enqueue(
            request, queryset, states=("warming", "running", "paused"), what="rolled back",
            send=lambda pk, actor: tasks.rollout_rollback.delay(pk, reason, actor),
        )  # fmt: skip


@admin.register(RolloutEvent)
class RolloutEventAdmin(_EventAdmin):
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
