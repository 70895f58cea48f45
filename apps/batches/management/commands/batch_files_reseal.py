"""``manage.py batch_files_reseal``: re-encrypt the Batch API's stored files with the at-rest
keyring's primary key (after a rotation, before the old key leaves the ring)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.batches.services.files import files_reseal
from runtime.crypto import KeyringError, SealError


class Command(BaseCommand):
    help = "Re-seal every Batch API file sealed with an older at-rest key (or none)."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            count = files_reseal()
        except (KeyringError, SealError, OSError) as exc:
            raise CommandError(f"re-sealing stopped: {exc}") from None
        self.stdout.write(f"re-sealed {count} file(s)")
