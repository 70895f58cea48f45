"""Model artifact manifests: a sha256 per file and one digest over them all.

An artifact is a directory (a Hugging Face model folder, for instance). Its manifest maps every
regular file's path relative to the directory (POSIX separators) to that file's sha256; its digest
is the sha256 of the sorted ``"relpath:sha256\\n"`` lines. The registry stores both on the
``ModelVersion``; a worker verifies a directory against them before it serves it.

A directory may carry its own manifest in :data:`MANIFEST_FILENAME`; that file is never part of
the manifest it describes. Standard library only: the data plane imports this.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MANIFEST_FILENAME = "switchyard-manifest.json"
_CHUNK = 1 << 20


class ArtifactError(Exception):
    """The artifact directory is missing, unreadable or does not match its expected digest."""


class ArtifactMismatchError(ArtifactError):
    """The directory's files differ from the expected manifest."""

    def __init__(self, expected: str, actual: str, changed: tuple[str, ...]) -> None:
        self.expected = expected
        self.actual = actual
        self.changed = changed
        detail = f"; differing files: {', '.join(changed)}" if changed else ""
        super().__init__(f"artifact digest {actual} does not match expected {expected}{detail}")


def file_sha256(path: Path) -> str:
    """Hex sha256 of one file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_digest(files: Mapping[str, str]) -> str:
    """The artifact digest: sha256 over the sorted ``"relpath:sha256\\n"`` lines."""
    lines = "".join(f"{rel}:{files[rel]}\n" for rel in sorted(files))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def compute_manifest(root: Path) -> tuple[str, dict[str, str]]:
    """Hash every regular file under ``root`` (recursively, symlinks not followed into dirs).

    Returns ``(digest, files)`` with ``files`` sorted by relative path. The directory's own
    :data:`MANIFEST_FILENAME` at the top level is left out.
    """
    root = Path(root)
    if not root.is_dir():
        raise ArtifactError(f"artifact directory {root} does not exist or is not a directory")
    files: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel == MANIFEST_FILENAME or not path.is_file():
                continue
            if "\n" in rel or "\r" in rel:
                raise ArtifactError(f"artifact file name {rel!r} contains a line break")
            files[rel] = file_sha256(path)
    ordered = dict(sorted(files.items()))
    return manifest_digest(ordered), ordered


def verify_artifact(
    root: Path, expected_digest: str, expected_files: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Check ``root`` against an expected digest; return its files on success.

    Raises :class:`ArtifactMismatchError` naming the files that differ (added, removed or
    changed) when ``expected_files`` is given, and :class:`ArtifactError` if ``root`` is absent.
    """
    actual_digest, files = compute_manifest(root)
    if actual_digest == expected_digest:
        return files
    changed: tuple[str, ...] = ()
    if expected_files is not None:
        names = set(files) | set(expected_files)
        changed = tuple(sorted(n for n in names if files.get(n) != expected_files.get(n)))
    raise ArtifactMismatchError(expected_digest, actual_digest, changed)


def write_manifest(
    root: Path, extra: Mapping[str, Any] | None = None
) -> tuple[str, dict[str, str]]:
    """Compute the manifest of ``root`` and store it in ``root / MANIFEST_FILENAME``.

    ``extra`` (JSON-serialisable) is stored alongside, e.g. how the artifact was made.
    """
    digest, files = compute_manifest(root)
    document: dict[str, Any] = {"digest": digest, "files": files}
    if extra:
        document["extra"] = dict(extra)
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    (Path(root) / MANIFEST_FILENAME).write_text(text, encoding="utf-8")
    return digest, files


def read_manifest(root: Path) -> dict[str, Any] | None:
    """The manifest stored in ``root``, or None if there is none or it is not valid JSON."""
    path = Path(root) / MANIFEST_FILENAME
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    if not isinstance(document.get("digest"), str) or not isinstance(document.get("files"), dict):
        return None
    return document
