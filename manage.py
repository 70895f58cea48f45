#!/usr/bin/env python
"""Django's command-line entry point for the Switchyard control plane."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line  # noqa: PLC0415

    from config import secret_key  # noqa: PLC0415
    from config.embedded import var_dir  # noqa: PLC0415

    # `up` keeps a generated SECRET_KEY in its var directory; it must exist before settings load.
    secret_key.ensure_for_up(sys.argv[1:2], os.environ, var_dir())

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
