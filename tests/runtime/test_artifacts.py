"""runtime.artifacts: per-file sha256 manifests and the artifact digest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from runtime.artifacts import (
    MANIFEST_FILENAME,
    ArtifactError,
    ArtifactMismatchError,
    compute_manifest,
    manifest_digest,
    read_manifest,
    verify_artifact,
    write_manifest,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    root = tmp_path / "artifact"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "config.json").write_text('{"a": 1}\n')
    (root / "weights.bin").write_bytes(bytes(range(256)) * 10)
    (root / "sub" / "tok.json").write_text("{}")
    (root / "sub" / "deeper" / "x").write_bytes(b"")
    return root


def test_manifest_hashes_every_file_by_relative_posix_path(artifact: Path) -> None:
    digest, files = compute_manifest(artifact)

    assert list(files) == ["config.json", "sub/deeper/x", "sub/tok.json", "weights.bin"]
    for rel, sha in files.items():
        assert sha == hashlib.sha256((artifact / rel).read_bytes()).hexdigest()
    lines = "".join(f"{rel}:{files[rel]}\n" for rel in sorted(files))
    assert digest == hashlib.sha256(lines.encode()).hexdigest()
    assert digest == manifest_digest(files)


def test_digest_does_not_depend_on_location_or_order(artifact: Path, tmp_path: Path) -> None:
    digest, files = compute_manifest(artifact)
    moved = artifact.rename(tmp_path / "elsewhere")

    assert compute_manifest(moved)[0] == digest
    assert manifest_digest(dict(reversed(list(files.items())))) == digest


def test_a_tampered_added_or_removed_file_changes_the_digest(artifact: Path) -> None:
    digest, files = compute_manifest(artifact)

    (artifact / "weights.bin").write_bytes(b"\x01" + (artifact / "weights.bin").read_bytes()[1:])
    with pytest.raises(ArtifactMismatchError) as info:
        verify_artifact(artifact, digest, files)
    assert info.value.changed == ("weights.bin",)
    assert info.value.expected == digest
    assert info.value.actual != digest
    assert "weights.bin" in str(info.value)

    (artifact / "extra.txt").write_text("new")
    (artifact / "sub" / "tok.json").unlink()
    with pytest.raises(ArtifactMismatchError) as info:
        verify_artifact(artifact, digest, files)
    assert info.value.changed == ("extra.txt", "sub/tok.json", "weights.bin")


def test_verify_without_expected_files_names_no_files(artifact: Path) -> None:
    digest, _ = compute_manifest(artifact)
    (artifact / "config.json").write_text("{}")

    with pytest.raises(ArtifactMismatchError) as info:
        verify_artifact(artifact, digest)
    assert info.value.changed == ()


def test_verify_returns_the_files_when_they_match(artifact: Path) -> None:
    digest, files = compute_manifest(artifact)

    assert verify_artifact(artifact, digest, files) == files


def test_missing_directory_is_an_artifact_error(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="does not exist"):
        compute_manifest(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArtifactError, match="not a directory"):
        verify_artifact(tmp_path / "file", "0" * 64)


def test_file_name_with_a_line_break_is_refused(tmp_path: Path) -> None:
    (tmp_path / "evil\nname").write_text("x")

    with pytest.raises(ArtifactError, match="line break"):
        compute_manifest(tmp_path)


def test_stored_manifest_is_left_out_of_the_digest(artifact: Path) -> None:
    before = compute_manifest(artifact)

    digest, files = write_manifest(artifact, extra={"seed": 3})

    assert (digest, files) == before
    assert compute_manifest(artifact) == before
    stored = read_manifest(artifact)
    assert stored == {"digest": digest, "files": files, "extra": {"seed": 3}}
    # A file of that name below the top level is an ordinary artifact file.
    (artifact / "sub" / MANIFEST_FILENAME).write_text("{}")
    assert f"sub/{MANIFEST_FILENAME}" in compute_manifest(artifact)[1]


@pytest.mark.parametrize(
    "content",
    ["not json", "[1, 2]", json.dumps({"digest": 1, "files": {}}), json.dumps({"digest": "x"})],
)
def test_unreadable_stored_manifest_reads_as_none(tmp_path: Path, content: str) -> None:
    assert read_manifest(tmp_path) is None
    (tmp_path / MANIFEST_FILENAME).write_text(content)

    assert read_manifest(tmp_path) is None
