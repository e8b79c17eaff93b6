"""A job's artifacts: the names its nodes' files are stored under, and storing them (a node's report, its kept
result after a late report, the nodes' logs at the end)."""

from __future__ import annotations

import hashlib
from pathlib import PurePosixPath

from django.core.files.base import ContentFile
from django.db import transaction

from fc2.models import Artifact, Job, Node

# Longest artifact file name, in UTF-8 bytes: file systems allow 255, and storage may add "_<7 characters>" on a clash.
ARTIFACT_FILE_NAME_BYTES = 200


def artifact_name(filename: str, node: str | None = None) -> str:
    """The name an artifact is stored under: the chief's files by their own name, another node's under `node/`.

    A name too long for its column (PostgreSQL refuses, SQLite would not) or for a file name on disk is shortened,
    keeping its extension, and marked with a digest of the full name, so that two long names stay two artifacts.

    >>> artifact_name("model.keras"), artifact_name("log.txt", "worker-0")
    ('model.keras', 'worker-0/log.txt')
    >>> name = artifact_name("x" * 300 + ".keras", "worker-0")
    >>> len(name), name[-21:]
    (209, 'xxx~8d43f7c74e3.keras')
    """
    prefix = f"{node}/" if node else ""
    max_chars = Artifact._meta.get_field("name").max_length - len(prefix)
    if len(filename) <= max_chars and len(filename.encode()) <= ARTIFACT_FILE_NAME_BYTES:
        return prefix + filename
    suffix = PurePosixPath(filename).suffix
    tail = f"~{hashlib.sha256(filename.encode()).hexdigest()[:11]}{suffix if len(suffix) <= 16 else ''}"
    stem = filename[: max_chars - len(tail)]
    while len(f"{stem}{tail}".encode()) > ARTIFACT_FILE_NAME_BYTES:
        stem = stem[:-1]
    return f"{prefix}{stem}{tail}"


def store_artifact(job: Job, name: str, data: bytes, node: Node | None = None) -> Artifact:
    """Store `data` as the job's artifact `name`, replacing (file and row) one stored under that name before."""
    with transaction.atomic():
        for old in Artifact.objects.filter(job=job, name=name):
            old.file.delete(save=False)
            old.delete()
        artifact = Artifact(job=job, node=node, name=name, size_bytes=len(data))
        artifact.file.save(name.rsplit("/", 1)[-1], ContentFile(data), save=False)
        artifact.save()
    return artifact
