"""A node's report as the platform keeps it: validated (`Report`), and written on the node's record — its status, exit
code, log tail, progress, samples and outputs. Below the pipeline: a report that arrives (fc2/services/reports.py,
which also moves the job on) and one fetched from a node after its job ended (pipeline.release) are kept alike."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated, Any, Literal, cast

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.utils import timezone
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from fc2 import jsonbounds
from fc2.models import Job, Node
from fc2.services import artifacts, checkpoints
from monitor.agent import MAX_NOT_KEPT_LISTED, MAX_OUTPUT_FILES
from monitor.ingest import record_losses, record_samples
from provisioner.types import is_chief

# Bounded to what the database columns hold, so an absurd value is a 400, not a failed save.
Count = Annotated[int, Field(ge=0, le=2**31 - 1)]
ByteCount = Annotated[int, Field(ge=0, le=2**63 - 1)]
MAX_PROGRESS_LOG = 1000  # progress lines in one report, as monitor/agent.py bounds them
MAX_BUFFERED_SAMPLES = 3600  # resource samples in one report, as monitor/agent.py's buffer holds them
MAX_OUTPUT_PATH = 4 * 255  # an output's name escaped: 255 bytes, each at most 4 characters (\xNN)
# metrics.json as the job keeps it to show (the file itself is among its results): every list of jobs reads it.
MAX_METRICS_CHARS = 64 * 1024
MAX_METRIC_STRING = 1000  # characters of one string in it (a label, a note): a page shows each


# A report is cleaned at the door (Report._at_the_door, fc2/jsonbounds.py): NaN and ±Infinity (a diverging run, a
# broken counter) are unknown rather than refused, since the report may carry a node's final status; allow_inf_nan=
# False then refuses the strings ("inf", "NaN") pydantic would otherwise read as floats.


class Progress(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    epoch: Count | None = None
    epochs: Count | None = None
    step: Count | None = None
    steps: Count | None = None
    loss: float | None = None


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


class Output(BaseModel):
    """One output a node's agent sends with its final report (monitor/agent.py, Outputs): `file` is the upload's
    name, `path` the output's own name, escaped."""

    model_config = ConfigDict(extra="ignore")
    file: str = Field(pattern=r"^[0-9]{1,6}$")
    path: str = Field(min_length=1, max_length=MAX_OUTPUT_PATH)
    size: ByteCount
    archive: bool = False


def shortened(limit: int) -> BeforeValidator:
    """A string past `limit` characters shortened to it in the middle (its start and its end kept, "…" between).

    >>> from pydantic import TypeAdapter
    >>> TypeAdapter(Annotated[str, shortened(5)]).validate_python("abcdefgh")
    'ab…gh'
    """

    def shorten(value: object) -> object:
        if isinstance(value, str) and len(value) > limit:
            return f"{value[: (limit - 1) // 2]}…{value[-(limit // 2) :]}"
        return value

    return BeforeValidator(shorten)


class NotKept(BaseModel):
    """An output the agent left behind, and why (e.g. over the size limit). Its path may be any depth down the
    output directory (a link inside a folder): a long one is shortened, never a reason to refuse a final report."""

    model_config = ConfigDict(extra="ignore")
    path: Annotated[str, shortened(MAX_OUTPUT_PATH)] = Field(min_length=1)
    size: ByteCount
    reason: Annotated[str, shortened(300)]


class Interruption(BaseModel):
    """A spot interruption notice a node's agent saw (monitor/agent.py, Notices): EC2's action and time, as sent."""

    model_config = ConfigDict(extra="ignore")
    at: Annotated[str, shortened(40)] = ""
    action: Annotated[str, shortened(40)] = Field(min_length=1)


class CheckpointSkipped(BaseModel):
    """A checkpoint the chief's agent did not ship, and why (over FC2_CHECKPOINT_MAX_MB, refused, not delivered)."""

    model_config = ConfigDict(extra="ignore")
    checkpoint: Annotated[str, shortened(200)] = Field(min_length=1)
    reason: Annotated[str, shortened(300)]


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
    interruption: Interruption | None = None  # a spot interruption notice the node got (issue 45)
    checkpoint_skipped: list[CheckpointSkipped] | None = Field(None, max_length=20)  # the chief's, not shipped
    # What the door changed in the report (NaN made unknown, NUL replaced, progress out of bounds left out), one line
    # each, for the job's timeline.
    _changes: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _at_the_door(cls, data: Any, handler: ModelWrapValidatorHandler[Report]) -> Report:
        """Whoever builds a report (the report API, a result fetched from a node) gets it cleaned (jsonbounds.clean).
        The progress is the node's code's own (its FC2_PROGRESS lines): a figure out of bounds there is left out, not
        a reason to refuse the report, which may carry the node's final status. Anything else wrong refuses it."""
        data, changes = jsonbounds.clean(data)
        try:
            report = handler(data)
        except ValidationError as exc:
            data, left_out = _without_bad_progress(data, exc)
            report = handler(data)
            changes += left_out
        report._changes = changes
        return report

    @property
    def changes(self) -> list[str]:
        return self._changes


def _without_bad_progress(data: Any, error: ValidationError) -> tuple[dict, list[str]]:
    """`data` without the progress figures `error` finds out of bounds, and a line for each kind left out; `error`
    itself when it finds anything else wrong."""
    bad = []
    for problem in error.errors(include_url=False):
        match problem["loc"]:
            case ("progress", str(name)) | ("progress_log", int(), str(name)) if name in ProgressLine.model_fields:
                bad.append(problem)
            case _:
                raise error
    left_out: dict[str, str] = {}
    for problem in bad:
        where, *at, field = problem["loc"]
        (data[where][at[0]] if at else data[where]).pop(field, None)
        left_out.setdefault(f"{where}{'[]' if at else ''}.{field}", problem["msg"].lower())
    return data, [f"{path} left out ({why})" for path, why in left_out.items()]


NODE_STATUS = {
    "started": Node.Status.STARTED,
    "running": Node.Status.RUNNING,
    "succeeded": Node.Status.SUCCEEDED,
    "failed": Node.Status.FAILED,
    "stopped": Node.Status.STOPPED,
}


def record(job: Job, node: Node, report: Report, files: list[UploadedFile]) -> artifacts.Stored:
    """Write the report on the node's record (and a chief's progress on the job's); store its outputs, each file up to
    FC2_MAX_ARTIFACT_MB (those past it listed as not kept). Whether the job goes on is the caller's. The lines the
    job's timeline gets say what was left behind, and what the door changed in the report or its metrics.json — each
    once: a node whose every report holds a NaN says so once."""
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
    stored = _store_outputs(job, node, report, files, chief=chief)
    changed = [f"{node.name}'s report: {change}" for change in report.changes] + stored.lines
    if report.interruption:
        changed.append(checkpoints.interruption_line(node.name, report.interruption.action, report.interruption.at))
    changed += [
        f"{node.name}: checkpoint {s.checkpoint} not shipped: {s.reason}" for s in report.checkpoint_skipped or []
    ]
    said = set(job.events.filter(message__in=changed).values_list("message", flat=True)) if changed else set()
    return replace(stored, lines=[line for line in dict.fromkeys(changed) if line not in said])


def _store_outputs(job: Job, node: Node, report: Report, files: list[UploadedFile], *, chief: bool) -> artifacts.Stored:
    """Store the report's files as the node's outputs, within FC2_MAX_ARTIFACT_MB (the agent keeps to it; past it,
    an output is listed as not kept), and take the chief's metrics.json as the job's metrics."""
    room = settings.FC2_MAX_ARTIFACT_MB * 2**20
    named = {output.file: output for output in report.outputs or []}
    kept: dict[str, bytes] = {}
    not_kept = [entry.model_dump() for entry in report.not_kept or []]
    for upload in files:
        wire, size = upload.name or "", upload.size or 0  # a file of a multipart request has both
        output = named.get(wire)
        path = output.path if output else jsonbounds.clean_text(wire)
        if size > room:
            reason = f"over the {settings.FC2_MAX_ARTIFACT_MB} MB limit on a node's outputs (FC2_MAX_ARTIFACT_MB)"
            not_kept.append({"path": path + ("/" if output and output.archive else ""), "size": size,
                             "reason": reason})  # fmt: skip
            continue
        room -= size
        kept[wire] = upload.read()
    manifest = {
        "outputs": [output.model_dump() for output in report.outputs or []],
        "not_kept": not_kept,
        "not_kept_more": report.not_kept_more,
    }
    stored = artifacts.store_outputs(job, node, manifest, kept, chief=chief)
    metrics = next((wire for wire in kept if (named[wire].path if wire in named else wire) == "metrics.json"), None)
    if chief and metrics is not None and not (metrics in named and named[metrics].archive):
        kept_metrics, changes = job_metrics(kept[metrics])
        Job.objects.filter(pk=job.pk).update(metrics=kept_metrics)
        stored.lines.extend(f"metrics.json: {change}" for change in changes)
    return stored


def job_metrics(data: bytes) -> tuple[dict, list[str]]:
    """The chief's metrics.json as the job keeps it to show — cleaned (jsonbounds.clean), its strings and itself
    bounded (MAX_METRIC_STRING, MAX_METRICS_CHARS: past it, its first entries that fit) — and what was changed, one
    line each."""
    try:
        loaded = jsonbounds.loads(data)
        cleaned, changes = jsonbounds.clean(
            loaded if isinstance(loaded, dict) else {"value": loaded}, max_string=MAX_METRIC_STRING
        )
        metrics = cast(dict, cleaned)  # clean keeps a dict a dict
    except ValueError as exc:  # not JSON, not UTF-8, nested too deep, an integer of more digits than Python reads
        why = jsonbounds.clean_text(str(exc))[:200]
        return {"error": "metrics.json is not valid JSON"}, [f"not valid JSON ({why}): not shown"]
    if len(json.dumps(metrics)) > MAX_METRICS_CHARS:
        kept, size = {}, 2
        for key, value in metrics.items():
            size += len(json.dumps({key: value}))
            if size > MAX_METRICS_CHARS:
                break
            kept[key] = value
        changes.append(
            f"over {MAX_METRICS_CHARS:,} characters: its first {len(kept)} of {len(metrics)} entries shown, the file "
            "itself is among the results"
        )
        metrics = kept
    return metrics, changes
