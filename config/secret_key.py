"""Django's SECRET_KEY: from the environment, or the file ``switchyard up`` keeps for one machine.

Outside ``DEBUG`` a key is required: ``SECRET_KEY`` (or ``SECRET_KEY_FILE``, a file holding
it) when set, else ``<SWITCHYARD_VAR_DIR>/secret_key`` when it exists. With none of them the
key is empty (never a public default: Django refuses to sign with it) and every serving process
refuses to start with an error naming ``SECRET_KEY``: the ASGI app, Celery worker and beat,
and ``manage.py`` commands (system check ``switchyard.E001``).
``switchyard up`` / ``manage.py up`` generate that file on their first run (mode 0600, 50 random
bytes, URL-safe) and keep it, so the processes ``up`` starts, and the ``manage.py`` commands run
against the same var directory, share one key that survives restarts (sessions stay valid).

Plain Python: no Django import, so ``manage.py`` can make the key before settings load.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from runtime.crypto import write_private_once

if TYPE_CHECKING:
    from django.apps import AppConfig
    from django.core.checks import CheckMessage

ENV_KEY: Final = "SECRET_KEY"
ENV_KEY_FILE: Final = "SECRET_KEY_FILE"
FILE_NAME: Final = "secret_key"
DEBUG_KEY: Final = "switchyard-insecure-debug-key"
MIN_LENGTH: Final = 32


class SecretKeyError(Exception):
    """No usable key outside DEBUG (settings turn it into ImproperlyConfigured)."""


def key_file(var_dir: Path) -> Path:
    return var_dir / FILE_NAME


def _read(path: Path) -> str:
    key = path.read_text(encoding="utf-8").strip()
    if len(key) < MIN_LENGTH:
        raise SecretKeyError(
            f"the secret key in {path} is shorter than {MIN_LENGTH} characters; delete the file "
            "to have `switchyard up` generate a new one, or set SECRET_KEY"
        )
    return key


def resolve(environ: Mapping[str, str], var_dir: Path, *, debug: bool) -> str:
    """The key the settings use (see the module docstring); SecretKeyError when none."""
    key = environ.get(ENV_KEY, "").strip()
    if key:
        return key
    named = environ.get(ENV_KEY_FILE, "").strip()
    if named:
        try:
            return _read(Path(named))
        except OSError as exc:
            raise SecretKeyError(f"SECRET_KEY_FILE={named!r} cannot be read: {exc}") from exc
    kept = key_file(var_dir)
    if kept.is_file():
        return _read(kept)
    if debug:
        return DEBUG_KEY
    raise SecretKeyError(
        "SECRET_KEY is not set. Outside DEBUG Django needs a secret key: set SECRET_KEY (or "
        f"SECRET_KEY_FILE, a file holding it), or run `switchyard up` once, which generates "
        f"{kept} and keeps it. Generate one with: python -c 'import secrets; "
        "print(secrets.token_urlsafe(50))'"
    )


def settings_key(environ: Mapping[str, str], var_dir: Path, *, debug: bool) -> tuple[str, str]:
    """(key, problem) for the settings: ("", the error) when there is no key. An empty key
    signs nothing (Django refuses to use it), and the processes that serve refuse to start:
    :func:`require` in the ASGI app and Celery's worker/beat, :func:`check` in ``manage.py``
    commands. Tools that only read the settings (mypy, collectstatic) still load them."""
    try:
        return resolve(environ, var_dir, debug=debug), ""
    except SecretKeyError as exc:
        return "", str(exc)


def require() -> None:
    """Refuse to start a serving process without a secret key (ImproperlyConfigured)."""
    from django.conf import settings  # noqa: PLC0415 - plain Python until called
    from django.core.exceptions import ImproperlyConfigured  # noqa: PLC0415

    problem = getattr(settings, "SECRET_KEY_PROBLEM", "")
    if problem:
        raise ImproperlyConfigured(problem)


def check(app_configs: Sequence[AppConfig] | None = None, **_kwargs: Any) -> list[CheckMessage]:
    """The Django system check (``switchyard.E001``) for the same (``manage.py`` commands)."""
    from django.conf import settings  # noqa: PLC0415
    from django.core.checks import Error  # noqa: PLC0415

    problem = getattr(settings, "SECRET_KEY_PROBLEM", "")
    return [Error(problem, id="switchyard.E001")] if problem else []


def ensure(var_dir: Path) -> Path:
    """Generate ``<var_dir>/secret_key`` (0600) unless it exists; its path. Two processes
    racing both end up with the one file written first (O_EXCL)."""
    path = key_file(var_dir)
    if not write_private_once(path, secrets.token_urlsafe(50) + "\n"):
        os.chmod(path, 0o600)  # kept, and kept private
    return path


def ensure_for_up(argv: list[str], environ: Mapping[str, str], var_dir: Path) -> None:
    """Before settings load: make the key file when the command is ``up`` and neither
    SECRET_KEY nor SECRET_KEY_FILE is set."""
    if argv[:1] != ["up"] or environ.get(ENV_KEY, "").strip():
        return
    if environ.get(ENV_KEY_FILE, "").strip():
        return
    ensure(var_dir)
