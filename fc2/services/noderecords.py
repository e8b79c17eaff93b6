"""A node's report as the platform keeps it: validated (`Report`), and written on the node's record — its status, exit
code, log tail, progress, samples and outputs. Below the pipeline: a report that arrives (fc2/services/reports.py,
which also moves the job on) and one fetched from a node after its job ended (pipeline.release) are kept alike."""

from __future__ import annotations

from typing import Annotated, Literal

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fc2 import jsonbounds
from fc2.models import Job, Node
from fc2.services import artifacts
from monitor.agent import MAX_NOT_KEPT_LISTED, MAX_OUTPUT_FILES
from monitor.ingest import finite_or_none, record_losses, record_samples
from provisioner.types import is_chief

# Bounded to what the database columns hold, so an absurd value is a 400, not a failed save.
Count = Annotated[int, Field(ge=0, le=2**31 - 1)]
ByteCount = Annotated[int, Field(ge=0, le=2**63 - 1)]
MAX_PROGRESS_LOG = 1000  # progress lines in one report, as monitor/agent.py bounds them
MAX_BUFFERED_SAMPLES = 3600  # resource samples in one report, as monitor/agent.py's buffer holds them
MAX_OUTPUT_PATH = 4 * 255  # an output's name escaped: 255 bytes, each at most 4 characters (\xNN)


# Reports are read with json.loads, which accepts NaN and ±Infinity: such a number (a diverging run, a broken counter)
# is kept as unknown rather than refused, since the report may carry a node's final status; allow_inf_nan=False then
# refuses the strings ("inf", "NaN") pydantic would otherwise read as floats. JSON cannot carry either to the charts.


class Progress(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    epoch: Count | None = None
    epochs: Count | None = None
    step: Count | None = None
    steps: Count | None = None
    loss: float | None = None

    _finite_loss = field_validator("loss", mode="before")(finite_or_none)


class ProgressLine(Progress):
    """One progress line as the agent read it, `at` its unix time then (the agent's clock)."""

    at: float | None = Field(None, ge=0, le=2**33)


class Sample(BaseModel):
    """One resource sample (monitor/agent.py's Sampler), `at` its unix time (the agent's clock)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    at: float | None = Field(None, ge=0, le=2**33)
    cpu_percent: float | None = Field(None, ge=0)
    node_cpu_percent: float | None = Field(None, ge=0)
    memory_mb: float | None = Field(None, ge=0)
    gpu_percent: float | None = Field(None, ge=0, le=100)
    gpu_memory_mb: float | None = Field(None, ge=0)
    bytes_sent: ByteCount | None = None
    bytes_recv: ByteCount | None = None

    _finite_readings = field_validator(
        "cpu_percent", "node_cpu_percent", "memory_mb", "gpu_percent", "gpu_memory_mb", mode="before"
    )(finite_or_none)


class Output(BaseModel):
    """One output a node's agent sends with its final report (monitor/agent.py, Outputs): `file` is the upload's
    name, `path` the output's own name, escaped."""

    model_config = ConfigDict(extra="ignore")
    file: str = Field(pattern=r"^[0-9]{1,6}$")
    path: str = Field(min_length=1, max_length=MAX_OUTPUT_PATH)
    size: ByteCount
    archive: bool = False


class NotKept(BaseModel):
    """An output the agent left behind, and why (e.g. over the size limit)."""

    model_config = ConfigDict(extra="ignore")
    path: str = Field(min_length=1, max_length=MAX_OUTPUT_PATH)
    size: ByteCount
    reason: str = Field(max_length=300)


class Report(BaseModel):
    model_config = ConfigDict(extra="ignore")
    node: str = Field(min_length=1, max_length=50)
    status: Literal["started", "running", "succeeded", "failed", "stopped"]
    exit_code: int | None = Field(None, ge=-(2**31), le=2**31 - 1)
    progress: Progress | None = None
    # Every progress line since the node's previous report (the agent bounds it); agents before it sent only `progress`.
    progress_log: list[ProgressLine] | None = Field(None, max_length=MAX_PROGRESS_LOG)
    sample: Sample | None = None  # agents before `samples` sent one per report
    # The samples taken since the node's previous report (an hour's at most: the agent's buffer).
    samples: list[Sample] | None = Field(None, max_length=MAX_BUFFERED_SAMPLES)
    log_tail: str | None = Field(None, max_length=100_000)
    # A final report's outputs: those sent with it, those left behind (the first ones) and how many more were.
    outputs: list[Output] | None = Field(None, max_length=MAX_OUTPUT_FILES)
    not_kept: list[NotKept] | None = Field(None, max_length=MAX_NOT_KEPT_LISTED)
    not_kept_more: Count | None = None


NODE_STATUS = {
    "started": Node.Status.STARTED,
    "running": Node.Status.RUNNING,
    "succeeded": Node.Status.SUCCEEDED,
    "failed": Node.Status.FAILED,
    "stopped": Node.Status.STOPPED,
}


def record(job: Job, node: Node, report: Report, files: list[UploadedFile]) -> artifacts.Stored:
    """Write the report on the node's record (and a chief's progress on the job's); store its outputs, each file up to
    FC2_MAX_ARTIFACT_MB (those past it listed as not kept). Whether the job goes on is the caller's."""
    now = timezone.now()
    progress = report.progress.model_dump(exclude_unset=True) if report.progress else {}
    chief = is_chief(job.strategy, node.role, node.index)
    with transaction.atomic():
        node.status = NODE_STATUS[report.status]
        node.last_report_at = now
        if report.status == "started":
            node.started_at = now
        if report.exit_code is not None:
            node.exit_code = report.exit_code
        if report.log_tail is not None:
            node.log_tail = report.log_tail
        for key in ("epoch", "step", "loss"):
            if key in progress:
                setattr(node, key, progress[key])
        node.save()
        samples = [*([report.sample] if report.sample else []), *(report.samples or [])]
        if samples:
            record_samples(node, [sample.model_dump() for sample in samples], now)
        if report.progress_log is not None:
            record_losses(node, (line.model_dump() for line in report.progress_log))
        elif progress:
            record_losses(node, [progress])
        if chief and progress:
            Job.objects.filter(pk=job.pk).update(**progress)
    return _store_outputs(job, node, report, files, chief=chief)


def _store_outputs(job: Job, node: Node, report: Report, files: list[UploadedFile], *, chief: bool) -> artifacts.Stored:
    """Store the report's files as the node's outputs, within FC2_MAX_ARTIFACT_MB (the agent keeps to it; past it,
    an output is listed as not kept), and take the chief's metrics.json as the job's metrics."""
    room = settings.FC2_MAX_ARTIFACT_MB * 2**20
    named = {output.file: output for output in report.outputs or []}
    kept: dict[str, bytes] = {}
    not_kept = [entry.model_dump() for entry in report.not_kept or []]
    for upload in files:
        output = named.get(upload.name)
        path = output.path if output else upload.name
        if upload.size > room:
            reason = f"over the {settings.FC2_MAX_ARTIFACT_MB} MB limit on a node's outputs (FC2_MAX_ARTIFACT_MB)"
            not_kept.append({"path": path + ("/" if output and output.archive else ""), "size": upload.size,
                             "reason": reason})  # fmt: skip
            continue
        room -= upload.size
        kept[upload.name] = upload.read()
    manifest = {
        "outputs": [output.model_dump() for output in report.outputs or []],
        "not_kept": not_kept,
        "not_kept_more": report.not_kept_more,
    }
    stored = artifacts.store_outputs(job, node, manifest, kept, chief=chief)
    metrics = next((wire for wire in kept if (named[wire].path if wire in named else wire) == "metrics.json"), None)
    if chief and metrics is not None and not (metrics in named and named[metrics].archive):
        Job.objects.filter(pk=job.pk).update(metrics=_metrics(kept[metrics]))
    return stored


def _metrics(data: bytes) -> dict:
    try:
        data = jsonbounds.loads(data)
    except ValueError:
        return {"error": "metrics.json is not valid JSON"}
    return data if isinstance(data, dict) else {"value": data}
