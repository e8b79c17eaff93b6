"""Node reports as they arrive: refused when the job has ended or the report is invalid; else kept on the node's record
(fc2/services/noderecords.py), and the job moved on — failed with the node, or collected when its chief succeeded.

A report is applied in one transaction — the node's status, its samples, outputs and metrics, the job's move — so one
that fails part-way leaves nothing: the node is not shown finished under a job that never moved on, which nobody would
look at again (the sweep looks at nodes without a final status).
"""

from __future__ import annotations

from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from pydantic import ValidationError

from common.columns import max_length
from fc2.models import Dataset, Job, Node
from fc2.results import LOG_INTRO
from fc2.services import noderecords, pipeline
from fc2.services.noderecords import Report
from monitor.agent import DATASET_FETCH_FAILED
from provisioner.types import is_chief


class ReportRejected(ValueError):
    """The report cannot be applied; `status` is the HTTP status to answer with, `detail` what is wrong with it."""

    def __init__(self, message: str, status: int = 400, detail: object = None):
        super().__init__(message)
        self.status = status
        self.detail = detail


def receive(job: Job, data: object, files: list[UploadedFile]) -> Job:
    """A node's report as it comes — over the report API, or fetched from the node when it never arrived: refused
    (ReportRejected) when the job has ended or it is not a valid report; applied otherwise. Its files are kept up to
    FC2_MAX_ARTIFACT_MB; those past it are listed as not kept (apply_report), never refused with the report."""
    if job.is_terminal:
        raise ReportRejected(f"job {job.pk} is {job.state}; no more reports are taken", 409)
    try:
        report = Report.model_validate(data)
    except ValidationError as exc:
        raise ReportRejected("invalid report", 400, exc.errors(include_url=False, include_context=False)) from exc
    return apply_report(job, report, files)


def apply_report(job: Job, report: Report, files: list[UploadedFile]) -> Job:
    """Keep the report on the node's record (noderecords.record) and move the job on (`move_on`), in one
    transaction."""
    node = job.nodes.filter(name=report.node).first()
    if node is None:
        raise ReportRejected(f"job {job.pk} has no node {report.node!r}")
    with transaction.atomic():
        stored = noderecords.record(job, node, report, files)
        for line in stored.lines:
            job.log(line)
        move_on(job, node)
    job.refresh_from_db()
    return job


def move_on(job: Job, node: Node, *, looked: bool = False) -> bool:
    """End the job as its node's recorded status says — failed with a node that failed (or restarted, when a lost
    node made it fail: pipeline.node_failed, `looked` by the job's driver), collected when its chief succeeded — if it
    has not moved on yet; whether it did now."""
    if node.status == Node.Status.FAILED:
        reason = f"{node.name} failed" + (f" with exit code {node.exit_code}" if node.exit_code is not None else "")
        tail = node.log_tail.strip()
        reason = f"{reason}{LOG_INTRO}{tail[-pipeline.LOG_TAIL_CHARS :]}" if tail else reason
        if tail.startswith(DATASET_FETCH_FAILED):
            Dataset.objects.filter(pk=job.dataset_id).update(last_error=tail[: max_length(Dataset, "last_error")])
        return pipeline.node_failed(job, reason, looked=looked)
    if node.status == Node.Status.SUCCEEDED and is_chief(job.strategy, node.role, node.index):
        Dataset.objects.filter(pk=job.dataset_id).exclude(last_error="").update(last_error="")
        return pipeline.complete(job)
    return False
