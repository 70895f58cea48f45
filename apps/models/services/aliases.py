"""The registry's rules for degradation fallbacks and model aliases (database reads only).

- ``Model.fallback``: another model (not an alias) of the same task; following fallbacks
  never comes back to the model (no cycles).
- ``Model.members``: an alias lists existing models of its task, none an alias itself; an
  alias has no versions and is nobody's fallback; a model an alias lists keeps its name.

:mod:`apps.models.services.catalog` calls these from its ``*_validate`` functions, so the
REST API and the admin get the same field errors. The router reads the result from the
snapshot (``ModelSnap.fallback``, ``Snapshot.aliases``: :mod:`runtime.gateway.aliases`).
"""

from __future__ import annotations

from apps.models import validators as v
from apps.models.models import Model

MAX_CHAIN = 64  # a fallback chain longer than this is refused as if it were a cycle


def fallback_error(
    *, name: str, task: str, fallback: Model | None, exclude_pk: int | None
) -> str | None:
    """What is wrong with ``fallback`` for the model ``name`` (``exclude_pk`` when it exists)."""
    if fallback is None:
        return None
    if fallback.pk == exclude_pk or fallback.name == name:
        return "A model cannot be its own fallback."
    if fallback.members:
        return f"The fallback must be a model, not the alias {fallback.name!r}."
    if fallback.task != task:
        return f"The fallback must be a {task} model; {fallback.name!r} is a {fallback.task} model."
    chain = [name, fallback.name]
    step: Model | None = fallback.fallback
    while step is not None:
        chain.append(step.name)
        if step.pk == exclude_pk or step.name == name or len(chain) > MAX_CHAIN:
            return f"Fallbacks must not form a cycle: {' -> '.join(chain)}."
        step = step.fallback
    return None


def members_error(*, name: str, task: str, members: object, exclude_pk: int | None) -> str | None:
    """What is wrong with ``members`` for the model ``name`` (an alias when non-empty)."""
    shape = v.members_shape_error(members)
    if shape is not None or not isinstance(members, list) or not members:
        return shape
    if name in members:
        return "An alias cannot list itself."
    found = {m.name: m for m in Model.objects.filter(name__in=members)}
    problems = (
        ("No model named", [m for m in members if m not in found]),
        ("Members must be models, not aliases:", [m for m in found if found[m].members]),
        (f"Members must be {task} models, not", [m for m in found if found[m].task != task]),
    )
    for what, names in problems:
        if names:
            return f"{what} {', '.join(map(repr, names))}."
    return _alias_role_error(name, exclude_pk)


def _alias_role_error(name: str, exclude_pk: int | None) -> str | None:
    """Whether the model ``name`` may become an alias: no versions, nobody's fallback, no
    alias's member."""
    if exclude_pk is not None:
        if Model.objects.get(pk=exclude_pk).versions.exists():
            return "A model with versions cannot be an alias; create a new model for the alias."
        if Model.objects.filter(fallback_id=exclude_pk).exists():
            return "A model that is another model's fallback cannot be an alias."
    if Model.objects.filter(members__contains=[name]).exists():
        return f"{name!r} is a member of an alias; an alias cannot be one."
    return None


def rename_error(model: Model, new_name: str) -> str | None:
    """A model an alias lists keeps its name (the alias names it)."""
    if new_name == model.name:
        return None
    listing = Model.objects.filter(members__contains=[model.name]).values_list("name", flat=True)
    if listing:
        return f"The alias(es) {', '.join(map(repr, listing))} list this model by name."
    return None


def alias_version_error(model: Model) -> str | None:
    """An alias serves through its members: it has no versions of its own."""
    if model.members:
        return f"{model.name!r} is an alias of {', '.join(model.members)}; it has no versions."
    return None
