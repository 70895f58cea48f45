"""The demo's signing key: `switchyard up`'s demo versions are signed so that workers, which
require signatures by default (``SWITCHYARD_ARTIFACT_SIGNATURES``), serve them.

The key is made once into ``<VAR_DIR>/signing/demo-signing-key.pem`` (mode 0600) and trusted
by the registry as ``demo-<fingerprint>``; ``make_demo_model`` and the demo seed sign the
versions they register with it (a version already signed is left as it is). A demo key on the
machine that serves is a convenience for one machine, not a supply chain: production keys stay
off the serving machines (docs/operations/signing.md).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apps.models.models import ModelVersion, TrustedKey
from apps.models.services.signing import model_version_sign_with, trusted_key_create
from runtime.signing import (
    KeyFileExistsError,
    create_private_key_file,
    key_fingerprint,
    load_private_key,
    public_key_text,
)

DEMO_KEY_PATH = Path("signing") / "demo-signing-key.pem"


def demo_private_key(var_dir: Path) -> Ed25519PrivateKey:
    """The demo key in ``var_dir`` (made on first use), trusted by the registry."""
    path = Path(var_dir) / DEMO_KEY_PATH
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(KeyFileExistsError):  # another seed made it just now
            create_private_key_file(path)
    key = load_private_key(path)
    public_key = public_key_text(key)
    if not TrustedKey.objects.filter(public_key=public_key).exists():
        name = f"demo-{key_fingerprint(public_key)}"
        trusted_key_create(actor=None, name=name, public_key=public_key)
    return key


def demo_sign(*, version: ModelVersion, var_dir: Path) -> bool:
    """Sign ``version`` with the demo key unless it is signed; True when it signed."""
    if version.signature:
        return False
    model_version_sign_with(actor=None, version=version, private_key=demo_private_key(var_dir))
    return True
