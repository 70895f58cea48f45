"""What a model declares to take part in retention (apps/common/retention.py applies it): a
class attribute ``retention: ClassVar[Retention] = Retention("usage", "occurred_at")``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Retention:
    """A model's retention policy: ``name`` picks its age in ``RETENTION_DAYS``."""

    name: str
    field: str  # the DateTimeField that ages a row
    archive: bool = False  # write each batch to the archive before deleting it
    min_days: float = 1.0  # a shorter age is refused (e.g. budgets read a month of usage)
