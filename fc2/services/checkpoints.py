"""A job's checkpoints on the platform: the archives its chief's agent ships while training runs (POST
/api/v1/jobs/<id>/checkpoint, monitor/agent.py's Shipper), each kept as an artifact named `checkpoints/<n>.tar.gz` (n
counts up within the job), the latest FC2_CHECKPOINTS_KEPT of them, downloadable like the job's other results and
removed with them; `latest(job)` is the one a resume restores from (RunSpec.restore_from).

A checkpoint is input like any report: read once at the door, bounded while it streams (FC2_CHECKPOINT_MAX_MB), checked
whole (monitor.agent.archive_members, the rule a node applies to what it restores), and stored wholly or not at all.
Interruption notices the agents report are lines on the job's timeline (`INTERRUPTION`); the platform's answer to every
report names the latest (`latest_interruption`), so that the chief checkpoints whichever node got one.
"""

from __future__ import annotations

import re
import tarfile
from typing import IO

from django.conf import settings
from django.core.files import File
from django.db import transaction

from fc2 import jsonbounds
from fc2.models import Artifact, Job, Node
from monitor.agent import UNREADABLE_ARCHIVE, ArchiveError, archive_members
from provisioner.types import is_chief

PREFIX = "checkpoints/"
NUMBERED = re.compile(rf"^{PREFIX}([0-9]+)\.tar\.gz$")
INTERRUPTION = "interruption notice"  # how a notice's line on the timeline reads, after the node's name
MAX_NAME = 200  # characters of a checkpoint's own name (TensorFlow's, e.g. ckpt-88) kept beside it
MAX_STEP = 2**63 - 1  # the largest step a checkpoint's row holds (PositiveBigIntegerField)


class CheckpointRejected(ValueError):
    """A checkpoint the platform does not take; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def parse_step(header: str) -> int | None:
    """A checkpoint's step as its agent sends it (X-FC2-Step): a whole number, or none ("")."""
    if not header:
        return None
    if not header.isascii() or not header.isdigit() or int(header) > MAX_STEP:
        raise CheckpointRejected(f"X-FC2-Step must be a whole number of steps, not {header[:40]!r}")
    return int(header)


def max_bytes() -> int:
    return settings.FC2_CHECKPOINT_MAX_MB * 2**20


def kept(job: Job) -> list[Artifact]:
    """The job's checkpoint archives, newest first."""
    return list(
        Artifact.objects.filter(job=job, name__startswith=PREFIX, not_kept="")
        .exclude(file="")
        .order_by("-created_at", "-pk")
    )


def latest(job: Job) -> Artifact | None:
    """The job's newest checkpoint archive, whose `file.path` a resume passes as RunSpec.restore_from; None when its
    chief has shipped none."""
    newest = kept(job)
    return newest[0] if newest else None


def check(archive: IO[bytes]) -> None:
    """Refuse (CheckpointRejected) an archive that is not a tar.gz of regular files within FC2_CHECKPOINT_MAX_MB."""
    try:
        with tarfile.open(fileobj=archive, mode="r:gz") as opened:
            archive_members(opened, max_bytes())
    except ArchiveError as error:
        raise CheckpointRejected(f"not a checkpoint archive: {error}") from error
    except UNREADABLE_ARCHIVE as error:
        raise CheckpointRejected(f"not a checkpoint archive: not a readable tar.gz archive ({error})") from error
    finally:
        archive.seek(0)


def receive(
    job: Job, node_name: str, checkpoint: str, archive: IO[bytes], size: int, step: int | None = None
) -> Artifact:
    """Keep a checkpoint archive the job's chief sent (`archive`, `size` bytes, read whole and bounded by the caller;
    `step`, the chief's step it was saved at when its agent knew it): refused when the job has ended, the node is not
    the job's chief, or the archive is not one; stored otherwise, and the job's older checkpoints past
    FC2_CHECKPOINTS_KEPT removed with their files."""
    if job.is_terminal:
        raise CheckpointRejected(f"job {job.pk} is {job.state}; no more checkpoints are taken", 409)
    node = job.nodes.filter(name=node_name).first()
    if node is None:
        raise CheckpointRejected(f"job {job.pk} has no node {node_name!r}")
    if not is_chief(job.strategy, node.role, node.index):
        raise CheckpointRejected(f"{node.name} is not the job's chief: only the chief's checkpoints are kept", 403)
    check(archive)
    return store(job, node, jsonbounds.clean_text(checkpoint)[:MAX_NAME], archive, size, step)


def store(job: Job, node: Node, checkpoint: str, archive: IO[bytes], size: int, step: int | None = None) -> Artifact:
    """Store the archive as the job's next checkpoint artifact and remove the oldest past FC2_CHECKPOINTS_KEPT: rows
    in one transaction, the new file removed again when it fails, the old files once it has not (nothing is
    half-written)."""
    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=job.pk).first()  # one checkpoint of a job numbered at a time
        numbers = [
            int(match.group(1))
            for name in Artifact.objects.filter(job=job, name__startswith=PREFIX).values_list("name", flat=True)
            if (match := NUMBERED.match(name))
        ]
        name = f"{PREFIX}{max(numbers, default=0) + 1:06d}.tar.gz"
        artifact = Artifact(job=job, node=node, name=name, original_name=checkpoint, size_bytes=size, step=step)
        artifact.file.save(name.rsplit("/", 1)[-1], File(archive), save=False)
        try:
            artifact.save()
            older = kept(job)[max(1, settings.FC2_CHECKPOINTS_KEPT) :]
            Artifact.objects.filter(pk__in=[old.pk for old in older]).delete()
        except BaseException:
            artifact.file.delete(save=False)
            raise
    for old in older:
        old.file.delete(save=False)
    return artifact


def interruption_line(node: str, action: str, at: str) -> str:
    """The timeline's line for an interruption notice a node reported."""
    when = f" at {at}" if at else ""
    return f"{node}: {INTERRUPTION} ({action}{when}): the chief is asked to checkpoint now"


def latest_interruption(job: Job) -> str:
    """When the job's latest interruption notice was recorded (ISO 8601), "" when it has had none: the platform's
    answer to each report names it, and the chief's agent asks its command for a checkpoint once for each."""
    event = job.events.filter(message__contains=f": {INTERRUPTION} (").order_by("-at", "-pk").first()
    return event.at.isoformat() if event else ""
