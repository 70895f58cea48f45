"""Pure validation rules of the model registry (no database access).

The services in :mod:`apps.models.services` call these and raise ``ValidationError``; the admin
forms reach them through the services' ``*_validate`` functions. The generic rules (numbers,
URLs, string maps, ``raise_if``) are the base app's: :mod:`apps.common.validation`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from apps.common.validation import is_int, str_map_error
from runtime.pool_policies import pool_policy_errors

# OpenAI-style model ids: "tiny-llama", "all-MiniLM-L6-v2", "org/name-7b".
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,98}[A-Za-z0-9])?$")
LABEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62}[A-Za-z0-9])?$")
POOL_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
TIER_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

MANIFEST_KEYS = ("tokenizer", "max_context", "default_sampling", "files")


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and SHA256_RE.fullmatch(value) is not None


def model_name_error(name: object) -> str | None:
    if not isinstance(name, str) or not MODEL_NAME_RE.fullmatch(name):
        return (
            "Model name must be 1-100 characters of letters, digits, '.', '_', '-' or '/', "
            "starting and ending with a letter or digit."
        )
    if "//" in name:
        return "Model name must not contain '//'."
    return None


REQUEST_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# The router reads these to route and meter; refusing them would refuse every request.
ROUTER_FIELDS = frozenset({"model", "messages", "prompt", "input"})


def refused_fields_error(fields: object) -> str | None:
    """A model's refused request fields: a list of distinct top-level field names."""
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        return 'Refused fields must be a JSON list of field names, e.g. ["logit_bias"].'
    bad = [f for f in fields if not REQUEST_FIELD_RE.fullmatch(f)]
    if bad:
        return f"Not a request field name: {', '.join(map(repr, bad))}."
    if len(set(fields)) != len(fields):
        return "Refused fields must not repeat."
    essential = sorted(ROUTER_FIELDS.intersection(fields))
    if essential:
        return f"The router needs {', '.join(essential)}; it cannot be refused."
    return None


def label_error(label: object) -> str | None:
    if not isinstance(label, str) or not LABEL_RE.fullmatch(label):
        return (
            "Label must be 1-64 characters of letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit."
        )
    return None


def manifest_errors(manifest: object, *, complete: bool) -> list[str]:
    """Problems with a version manifest.

    ``complete=False`` (a draft) checks only the keys that are present; ``complete=True``
    (publishing) also requires every key in :data:`MANIFEST_KEYS`.
    """
    if not isinstance(manifest, Mapping):
        return ["Manifest must be a JSON object."]
    errors: list[str] = []
    if complete:
        missing = [key for key in MANIFEST_KEYS if key not in manifest]
        if missing:
            errors.append(f"Manifest is missing required key(s): {', '.join(missing)}.")
    if "tokenizer" in manifest:
        tokenizer = manifest["tokenizer"]
        if not isinstance(tokenizer, str) or not tokenizer.strip():
            errors.append("Manifest 'tokenizer' must be a non-empty string.")
    if "max_context" in manifest:
        max_context = manifest["max_context"]
        if not is_int(max_context) or max_context <= 0:
            errors.append("Manifest 'max_context' must be a positive integer.")
    if "default_sampling" in manifest and not isinstance(manifest["default_sampling"], Mapping):
        errors.append("Manifest 'default_sampling' must be an object.")
    if "files" in manifest:
        errors.extend(_manifest_files_errors(manifest["files"]))
    return errors


def _manifest_files_errors(files: object) -> list[str]:
    if not isinstance(files, Mapping):
        return ["Manifest 'files' must be an object mapping relative paths to sha256 digests."]
    errors: list[str] = []
    for path, digest in files.items():
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
            errors.append(
                f"Manifest file path {path!r} must be a relative path inside the artifact."
            )
        if not is_sha256(digest):
            errors.append(
                f"Manifest file {path!r} needs a sha256 digest of 64 lowercase hex digits."
            )
    return errors


def pool_policies_error(policies: object) -> str | None:
    """None when ``policies`` is a string map the router uses as written: every key known and
    every name and parameter accepted by the runtime's registries (:mod:`runtime.pool_policies`).
    """
    shape_error = str_map_error(policies, "Policies")
    if shape_error is not None or not isinstance(policies, Mapping):
        return shape_error
    errors = pool_policy_errors(policies)
    return " ".join(errors) if errors else None
