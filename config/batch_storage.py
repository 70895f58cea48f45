"""Where the Batch API's files are stored: the ``batches`` entry of Django's ``STORAGES``.

Plain Python (no Django import): the settings call :func:`batch_storage` with the environment.

- ``SWITCHYARD_BATCH_STORAGE`` unset or empty: local files under ``<var dir>/batch-files``
  (``FileSystemStorage``).
- ``SWITCHYARD_BATCH_STORAGE=s3://bucket`` or ``s3://bucket/some/prefix``: an S3-compatible
  object store through django-storages (``storages.backends.s3.S3Storage``; install the
  ``s3`` extra), objects under the prefix. ``SWITCHYARD_BATCH_S3_ENDPOINT_URL`` names a store
  other than AWS (MinIO, Ceph, ...; then path-style addressing), ``SWITCHYARD_BATCH_S3_REGION``
  its region. The credentials are boto3's own chain, never a setting of ours:
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``) in the
  environment, ``~/.aws``, or the machine's role.

Either way the stored bytes are sealed per tenant (``apps/batches/sealing.py``): the store
never holds a file's plaintext.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

S3_BACKEND = "storages.backends.s3.S3Storage"
LOCAL_BACKEND = "django.core.files.storage.FileSystemStorage"


class BatchStorageError(ValueError):
    """``SWITCHYARD_BATCH_STORAGE`` names no storage this module knows."""


def batch_storage(
    spec: str, var_dir: Path, *, endpoint_url: str = "", region: str = ""
) -> dict[str, Any]:
    """The ``STORAGES["batches"]`` entry for ``spec`` (see the module docstring)."""
    spec = spec.strip()
    if not spec:
        return {"BACKEND": LOCAL_BACKEND, "OPTIONS": {"location": str(var_dir / "batch-files")}}
    parts = urlsplit(spec)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise BatchStorageError(
            f"SWITCHYARD_BATCH_STORAGE={spec!r}: expected s3://bucket[/prefix] (or empty for "
            "local files under the var directory)"
        )
    options: dict[str, Any] = {
        "bucket_name": parts.netloc,
        "location": parts.path.strip("/"),
        "file_overwrite": True,  # names are unique (the file's id); a re-seal rewrites in place
        "default_acl": None,  # the bucket's own policy: never public-read
        "querystring_auth": True,
    }
    if endpoint_url.strip():
        options["endpoint_url"] = endpoint_url.strip()
        options["addressing_style"] = "path"  # MinIO and most S3-compatible stores
    if region.strip():
        options["region_name"] = region.strip()
    return {"BACKEND": S3_BACKEND, "OPTIONS": options}


def from_env(env: Mapping[str, str], var_dir: Path) -> dict[str, Any]:
    """:func:`batch_storage` with the environment's settings."""
    return batch_storage(
        env.get("SWITCHYARD_BATCH_STORAGE", ""),
        var_dir,
        endpoint_url=env.get("SWITCHYARD_BATCH_S3_ENDPOINT_URL", ""),
        region=env.get("SWITCHYARD_BATCH_S3_REGION", ""),
    )
