"""A job's artifacts: the names its nodes' outputs are stored under, and storing them (a node's report, its kept
result after a late report, the nodes' logs at the end).

A node's code may name its outputs anything Linux allows — whitespace only, a leading `-` or `.`, newlines, bytes
that are not UTF-8, 255 bytes long. Its agent sends each under a number and names it in its report, escaped
(monitor.agent.escape_name); here each becomes an artifact under a safe, readable name of its own (`safe_name`:
letters, digits, `_`, `-` and `.`, never empty, never hidden, unique in the job), its escaped name kept beside it
(`Artifact.original_name`). An output the agent left behind (over the size limit) is an artifact with no file that
says why (`Artifact.not_kept`). One output that cannot be stored never costs the others, nor the report.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from django.core.files.base import ContentFile
from django.db import transaction

from common.columns import max_length
from fc2.models import Artifact, Job, Node

logger = logging.getLogger(__name__)

# Longest artifact file name, in UTF-8 bytes: file systems allow 255, and storage may add "_<7 characters>" on a clash.
ARTIFACT_FILE_NAME_BYTES = 200
# What a safe name may hold: what Django's storage keeps of a name (get_valid_name), so storing never changes it.
UNSAFE = re.compile(r"[^\w.-]")


def safe_name(escaped: str, archive: bool = False) -> str:
    """A name to store an output under, readable and valid anywhere, from its escaped name (a directory's archive
    ends in .zip).

    >>> safe_name("model.keras"), safe_name(" "), safe_name("-rf"), safe_name(".env"), safe_name("a\\\\nb")
    ('model.keras', 'output', '_rf', '_env', 'a_nb')
    >>> safe_name("saved model", archive=True), safe_name("..."), safe_name("日本.txt")
    ('saved_model.zip', '_..', '日本.txt')
    """
    name = UNSAFE.sub("_", escaped)
    if name[:1] in (".", "-"):  # never hidden, never taken for an option
        name = "_" + name[1:]
    if not name.strip("_"):
        name = "output"
    return f"{name}.zip" if archive else name


def artifact_name(filename: str, node: str | None = None) -> str:
    """The name an artifact is stored under: the chief's files by their own name, another node's under `node/`.

    A name too long for its column (PostgreSQL refuses, SQLite would not) or for a file name on disk is shortened,
    keeping its extension, and marked with a digest of the full name, so that two long names stay two artifacts.

    >>> artifact_name("model.keras"), artifact_name("log.txt", "worker-0")
    ('model.keras', 'worker-0/log.txt')
    >>> name = artifact_name("x" * 300 + ".keras", "worker-0")
    >>> len(name), name[-21:]
    (209, 'xxx-8d43f7c74e3.keras')
    """
    prefix = f"{node}/" if node else ""
    max_chars = max_length(Artifact, "name") - len(prefix)
    if len(filename) <= max_chars and len(filename.encode()) <= ARTIFACT_FILE_NAME_BYTES:
        return prefix + filename
    return prefix + _marked(filename, filename, max_chars)


def _marked(name: str, original: str, max_chars: int) -> str:
    """`name` with a digest of `original` before its extension, within `max_chars` and the file name's bytes."""
    suffix = PurePosixPath(name).suffix
    suffix = suffix if len(suffix) <= 16 else ""
    tail = f"-{hashlib.sha256(original.encode(errors='surrogatepass')).hexdigest()[:11]}{suffix}"
    stem = name[: len(name) - len(suffix)][: max_chars - len(tail)]
    while len(f"{stem}{tail}".encode()) > ARTIFACT_FILE_NAME_BYTES:
        stem = stem[:-1]
    return f"{stem}{tail}"


def store_artifact(
    job: Job,
    name: str,
    data: bytes,
    node: Node | None = None,
    original_name: str = "",
    not_kept: str = "",
    size_bytes: int | None = None,
) -> Artifact:
    """Store `data` as the job's artifact `name` (safe: see safe_name), replacing (file and row) one stored under that
    name before. With `not_kept`, the artifact says why the output (of `size_bytes`) is not there, and has no file."""
    with transaction.atomic():
        for old in Artifact.objects.filter(job=job, name=name):
            old.file.delete(save=False)
            old.delete()
        artifact = Artifact(
            job=job, node=node, name=name, original_name=original_name, not_kept=not_kept,
            size_bytes=len(data) if size_bytes is None else size_bytes,
        )  # fmt: skip
        if not not_kept:
            artifact.file.save(name.rsplit("/", 1)[-1], ContentFile(data), save=False)
        try:
            artifact.save()
        except BaseException:
            if artifact.file:
                artifact.file.delete(save=False)
            raise
    return artifact


def _place(job: Job, node: Node, prefix: str | None, original: str, archive: bool) -> str:
    """The artifact name for a node's output: the one it had (a report delivered again replaces it), else its safe
    name, marked with a digest of its original where another output of the job has that name already (a folder and
    a file whose archive names meet; two names that differ only in what is not safe)."""
    same = Artifact.objects.filter(job=job, node=node, original_name=original).values_list("name", flat=True).first()
    if same is not None:
        return same
    name = artifact_name(safe_name(original, archive), prefix)
    if not Artifact.objects.filter(job=job, name=name).exists():
        return name
    max_chars = max_length(Artifact, "name") - len(f"{prefix}/" if prefix else "")
    return artifact_name(_marked(safe_name(original, archive), original, max_chars), prefix)


@dataclass
class Stored:
    """What became of a node's outputs: the artifacts stored and the lines the job's timeline gets (what was left
    behind, what could not be stored)."""

    artifacts: list[Artifact]
    lines: list[str]


def store_outputs(job: Job, node: Node, report: Mapping, files: Mapping[str, bytes], *, chief: bool) -> Stored:
    """Store the outputs a node's final report names (`outputs`, `not_kept`), the file of each from `files` by its
    wire name; an upload the report does not name is an output of that name (agents before `outputs`).

    Each output is stored on its own (a savepoint each): one that fails is a line, and the rest are still stored."""
    prefix = None if chief else node.name
    named = {o["file"]: o for o in report.get("outputs") or [] if isinstance(o, Mapping) and "file" in o}
    stored, lines = [], []
    for wire, data in files.items():
        output = named.get(wire, {"path": wire})
        original, archive = str(output.get("path") or wire), bool(output.get("archive"))
        try:
            with transaction.atomic():
                name = _place(job, node, prefix, original, archive)
                stored.append(store_artifact(job, name, data, node=node, original_name=original))
        except Exception as exc:
            logger.exception("job %s: %s's output %r could not be stored", job.pk, node.name, original)
            lines.append(f"{node.name}: output {original!r} could not be stored ({exc})")
    for output in report.get("not_kept") or []:
        original, size, reason = str(output["path"]), int(output["size"]), str(output["reason"])
        lines.append(f"{node.name}: output {original!r} ({_size(size)}) not kept: {reason}")
        try:
            with transaction.atomic():
                name = _place(job, node, prefix, original, archive=False)
                store_artifact(job, name, b"", node=node, original_name=original, not_kept=reason, size_bytes=size)
        except Exception:
            logger.exception("job %s: %s's output %r could not be listed", job.pk, node.name, original)
    if more := report.get("not_kept_more"):
        lines.append(f"{node.name}: {more} more outputs not kept (over the limits on a node's outputs)")
    return Stored(stored, lines)


def _size(size: int) -> str:
    """
    >>> _size(312 * 2**20), _size(2048), _size(12)
    ('312 MB', '2 KB', '12 bytes')
    """
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"
