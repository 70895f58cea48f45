"""``manage.py publish_snapshot``: build the runtime snapshot now and publish it to Redis."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from apps.core import services


class Command(BaseCommand):
    help = "Build the runtime snapshot from the database and publish it to Redis."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--if-changed",
            action="store_true",
            help="Publish only if the database differs from the latest published snapshot.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["if_changed"]:
                version = services.snapshot_refresh()
            else:
                version = services.snapshot_publish()
        except (RedisError, OSError) as exc:
            raise CommandError(f"could not publish the snapshot to Redis: {exc}") from exc
        if version is None:
            self.stdout.write("snapshot unchanged; nothing published")
        else:
            self.stdout.write(f"published snapshot version {version}")
