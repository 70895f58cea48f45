"""Django's command line inside the package: ``python -m config.manage COMMAND`` or
``python <package dir>/config/manage.py COMMAND``.

What ``manage.py`` in the checkout and ``switchyard manage`` call. The processes Switchyard
starts itself (``up``'s steps, the local actuator's replicas) run this file by its path
(:func:`config.paths.manage_command`), so an installed wheel needs no ``manage.py`` beside the
packages and their command lines still read ``.../manage.py serve_model ...`` (operators and the
chaos suite find replicas by that).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run by its path: Python put config/ first on sys.path, where config/celery.py would shadow
    # Celery itself; the directory holding the packages goes there instead.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)


def main(argv: Sequence[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line  # noqa: PLC0415

    from config import secret_key  # noqa: PLC0415
    from config.paths import default_var_dir  # noqa: PLC0415
    from runtime.cache import sealing  # noqa: PLC0415

    args = list(sys.argv if argv is None else argv)
    # `up` keeps a generated SECRET_KEY in its var directory; it must exist before settings load.
    secret_key.ensure_for_up(args[1:2], os.environ, default_var_dir(os.environ).resolve())
    # ... and the keys that encrypt the cache in Redis (runtime/cache/sealing.py), the same way.
    sealing.ensure_for_up(args[1:2], os.environ, default_var_dir(os.environ).resolve())
    execute_from_command_line(args)


if __name__ == "__main__":
    main()
