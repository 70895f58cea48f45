"""Where Switchyard's own files are, in a development checkout or an installed wheel.

Plain Python (no Django): ``config.embedded``, ``config.cli``, the settings and the commands
that start processes read it. The package data (the Procfile, the templates, the static files)
lives inside the packages, so the same paths work from ``site-packages``; what is not package
data (``var/``) is the checkout's in a checkout and the current directory's otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent  # config/
SOURCE_ROOT = PACKAGE_DIR.parent  # the checkout, or site-packages for an installed wheel


def is_checkout() -> bool:
    """True when running from a source tree (its pyproject.toml beside the packages)."""
    return (SOURCE_ROOT / "pyproject.toml").is_file()


def procfile() -> Path:
    """The Procfile ``switchyard up`` runs (package data: config/Procfile)."""
    return PACKAGE_DIR / "Procfile"


def manage_command() -> list[str]:
    """How to run a management command as a process: this interpreter and config/manage.py.

    The same environment as the caller; no ``manage.py`` beside the packages is needed (an
    installed wheel has none), and the command line still reads ``manage.py COMMAND``.
    """
    return [sys.executable, str(PACKAGE_DIR / "manage.py")]


def default_var_dir(env: Mapping[str, str]) -> Path:
    """SWITCHYARD_VAR_DIR, else ``var/`` in the checkout, else ``./var`` (an installed wheel:
    site-packages is no place for data)."""
    configured = env.get("SWITCHYARD_VAR_DIR")
    if configured:
        return Path(configured)
    return (SOURCE_ROOT if is_checkout() else Path.cwd()) / "var"
