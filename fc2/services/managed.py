"""A managed job as people see it (issue 45): its restarts after a lost node, its spot choice, the markets its cluster
was billed in and its kept checkpoints, read back for its page and the jobs API. Read only: the pipeline writes
`Job.restarts` (pipeline.node_lost, bootstrap), pricing.bill `Job.rates`, the checkpoint service the `checkpoints/…`
artifacts. Both JSON fields are the platform's own, yet read here as if they were not: a value of the wrong kind is
shown as unknown, never a failed page."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from fc2.models import Artifact, Job
from fc2.services import checkpoints, pricing


@dataclass(frozen=True)
class Restart:
    """One restart of a job: its lost nodes, why, the work lost since the last checkpoint and its resume."""

    number: int
    at: datetime | None  # when the loss was seen
    nodes: tuple[str, ...]
    reason: str
    lost_in: str  # the job's state when its node was lost: running, or provisioning / bootstrapping
    lost_steps: int | None  # the chief's steps since the checkpoint; None: not known
    lost_s: float | None  # seconds of training since it
    lost_dollars: float | None  # their $ at the cluster's hourly cost
    checkpoint: str  # the checkpoint resumed from (its file name); "": from the start
    checkpoint_artifact: Artifact | None  # that checkpoint, where it is still kept
    resumed_at: datetime | None  # when its nodes started again; None while the restart is under way

    @property
    def back_after_s(self) -> float | None:
        """Seconds from the loss seen to training again."""
        if self.at is None or self.resumed_at is None:
            return None
        return max(0.0, (self.resumed_at - self.at).total_seconds())


@dataclass(frozen=True)
class Managed:
    """A job's restarts and spot choice, and the checkpoints it keeps."""

    max_restarts: int
    restarts: list[Restart]
    spot: bool
    spot_max_price: Decimal | None
    spot_fallback: str  # its label: "On-demand instances" or "Wait for spot capacity"
    checkpoints: list[Artifact]  # newest first

    @property
    def made(self) -> int:
        return len(self.restarts)

    @property
    def under_way(self) -> Restart | None:
        """The restart whose nodes are not started again yet."""
        return self.restarts[-1] if self.restarts and self.restarts[-1].resumed_at is None else None

    @property
    def lost_s(self) -> float:
        return sum(r.lost_s or 0.0 for r in self.restarts)

    @property
    def lost_dollars(self) -> float:
        return sum(r.lost_dollars or 0.0 for r in self.restarts)


def of_job(job: Job) -> Managed | None:
    """The job's restarts, spot choice and checkpoints; None for a job that asked for neither restarts nor spot and
    had none made (its page shows no such section)."""
    entries = job.restarts if isinstance(job.restarts, list) else []
    if not (job.max_restarts or entries or job.spot):
        return None
    kept = checkpoints.kept(job)
    by_name = {artifact.name.removeprefix(checkpoints.PREFIX): artifact for artifact in kept}
    rows = [_restart(index + 1, entry, by_name) for index, entry in enumerate(entries) if isinstance(entry, dict)]
    return Managed(
        max_restarts=job.max_restarts,
        restarts=rows,
        spot=job.spot,
        spot_max_price=job.spot_max_price if job.spot else None,
        spot_fallback=Job.SpotFallback(job.spot_fallback).label
        if job.spot_fallback in Job.SpotFallback.values
        else str(job.spot_fallback),
        checkpoints=kept,
    )


def restart_fields(entry: object) -> dict:
    """One `Job.restarts` entry as the jobs API gives it (its RestartOutput), each field None (or empty) where the
    entry's is not of its kind."""
    row = _restart(0, entry if isinstance(entry, dict) else {}, {})
    fields = ("at", "reason", "lost_steps", "lost_s", "lost_dollars", "checkpoint", "resumed_at")
    return {"nodes": list(row.nodes), **{name: getattr(row, name) for name in fields}}


def rate_fields(entry: object) -> dict:
    """One `Job.rates` span (pricing.bill) as the jobs API gives it (its RateOutput): its market, $/h and moments,
    each None where the entry's is not of its kind."""
    entry = entry if isinstance(entry, dict) else {}
    market = entry.get("market")
    return {
        "market": market if market in (pricing.SPOT, pricing.ON_DEMAND) else None,
        "hourly_cost": _number(entry.get("hourly_cost")),
        "started_at": _moment(entry.get("started_at")),
        "ended_at": _moment(entry.get("ended_at")),
    }


def _restart(number: int, entry: dict, by_name: dict[str, Artifact]) -> Restart:
    nodes = entry.get("nodes")
    checkpoint = entry.get("checkpoint")
    checkpoint = checkpoint if isinstance(checkpoint, str) else ""
    return Restart(
        number=number,
        at=_moment(entry.get("at")),
        nodes=tuple(str(node) for node in nodes) if isinstance(nodes, list) else (),
        reason=str(entry.get("reason") or ""),
        lost_in=str(entry.get("state") or ""),
        lost_steps=None if (steps := _number(entry.get("lost_steps"))) is None else int(steps),
        lost_s=_number(entry.get("lost_s")),
        lost_dollars=_number(entry.get("lost_dollars")),
        checkpoint=checkpoint,
        checkpoint_artifact=by_name.get(checkpoint) if checkpoint else None,
        resumed_at=_moment(entry.get("resumed_at")),
    )


def _moment(text: object) -> datetime | None:
    """An ISO 8601 moment with its time zone (as the pipeline writes them), None for anything else."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _number(value: object) -> float | None:
    """A finite number, None for anything else (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
