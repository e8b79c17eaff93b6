"""A job's checkpoints on the platform: the archives its chief's agent ships while training runs (POST
/api/v1/jobs/<id>/checkpoint), each kept as an artifact named `checkpoints/<n>.tar.gz` (n counts up within the job),
the latest FC2_CHECKPOINTS_KEPT of them; `latest(job)` is the one a resume restores from (RunSpec.restore_from)."""

from __future__ import annotations

from fc2.models import Artifact, Job

PREFIX = "checkpoints/"


def kept(job: Job) -> list[Artifact]:
    """The job's checkpoint archives, newest first (those with a file: one over the size bound is never stored)."""
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
