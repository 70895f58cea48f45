"""Small helpers every app's admin shares (writes go through services)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from django import forms
from django.contrib import admin
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db.models import Model
from django.http import HttpRequest

_M = TypeVar("_M", bound=Model)
_P = TypeVar("_P", bound=Model)

# django-stubs makes ModelForm, ModelAdmin and TabularInline generic in the model, but the real
# classes are not subscriptable: these bases are, so an app writes ``ModelFormBase[Price]``.
if TYPE_CHECKING:
    ModelFormBase = forms.ModelForm
    ModelAdminBase = admin.ModelAdmin
    TabularInlineBase = admin.TabularInline
else:

    class ModelFormBase(forms.ModelForm, Generic[_M]):
        """``forms.ModelForm``, subscriptable at runtime."""

    class ModelAdminBase(admin.ModelAdmin, Generic[_M]):
        """``admin.ModelAdmin``, subscriptable at runtime."""

    class TabularInlineBase(admin.TabularInline, Generic[_M, _P]):
        """``admin.TabularInline``, subscriptable at runtime."""


def actor_of(request: HttpRequest) -> AbstractBaseUser | None:
    user = request.user
    return user if isinstance(user, AbstractBaseUser) else None


def adopt(obj: Model, saved: Model) -> None:
    """Point the admin's unsaved form instance at the row the service created."""
    obj.pk = saved.pk
    obj._state.adding = False


def add_service_errors(form: forms.BaseForm, error: ValidationError) -> None:
    """Show a service's ValidationError on the form: per field where the form has the field,
    as a form-wide error otherwise."""
    if not hasattr(error, "error_dict"):
        form.add_error(None, error)
        return
    for field, messages in error.message_dict.items():
        target = field if field in form.fields and field != NON_FIELD_ERRORS else None
        form.add_error(target, messages)


def run_validator(form: forms.BaseForm, validate: Callable[[], Any]) -> None:
    """Call a service validator; its errors become form errors."""
    try:
        validate()
    except ValidationError as error:
        add_service_errors(form, error)
