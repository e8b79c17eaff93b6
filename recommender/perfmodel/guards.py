"""The guards: which configurations the predictor may answer at all, and why not — pure functions over what the runs
measured (`Runs`), run before the model, in the order `GUARDS` lists them. Each returns why a configuration is
refused, or "" to let it through:

1. `unpriced` — a worker type with no runs whose speed the catalogue does not give: nothing prices it;
2. `failed_here` — a run of it failed at this very point, or it only ever failed at this batch size;
3. `one_machine_unmeasured` — all-reduce without a run of one machine: the runs of several cannot tell its computing
   apart from the collectives they pay on every step;
4. `axis_never_varied` — every run measured one worker count, batch size or latency and another is asked: nothing in
   the runs tells what that axis costs;
5. `outside_runs_without_model` — too few runs to fit a model: only the measured ranges of the type are answered.

Everything else is answered, and the model's interval says how far to trust it. A failed run near a configuration is
no refusal but a warning (`warning`, recommender.algorithms.failure_risk).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from recommender.algorithms import failure_risk, one_machine_latency_free
from recommender.types import PerfRecord

Point = tuple[str, int, int | None, float]  # worker type, workers, batch size (None: unknown), latency ms


@dataclass(frozen=True)
class Runs:
    """What a workload's runs measured, as the guards read it."""

    failed: Mapping[tuple[str, int], Counter]  # (worker type, n) -> {(batch size, latency): failed runs there}
    succeeded: Mapping[tuple[str, int], Counter]  # the same, of runs with an epoch time
    latency_free: bool  # one machine's time is latency-independent (all-reduce: it sends nothing over the network)
    workers: tuple[int, ...]  # the worker counts measured
    batch_sizes: tuple[int, ...]
    latencies: tuple[float, ...]  # the latencies paid (one machine of an all-reduce workload pays none)
    priced: frozenset[str]  # the worker types the mean can price (their runs, or a catalogue speed)
    has_model: bool  # a fitted model extrapolates; without one only the measured ranges are answered

    def ranges(self, worker_type: str) -> list[tuple[float, float]]:
        """The measured ranges of n, B and paid latency of one worker type's runs ([] when it has none)."""
        own = [(n, b, lat) for (t, n), points in self.succeeded.items() if t == worker_type for b, lat in points]
        if not own:
            return []
        paid = [lat for n, _, lat in own if not (self.latency_free and n == 1)] or [0.0]
        batches = [b for _, b, _ in own if b is not None] or [0]
        return [(min(n for n, _, _ in own), max(n for n, _, _ in own)), (min(batches), max(batches)),
                (min(paid), max(paid))]  # fmt: skip


def runs_of(
    usable: Sequence[PerfRecord], records: Sequence[PerfRecord], priced: frozenset[str], has_model: bool
) -> Runs:
    """The guards' view of a workload: usable, its runs with an epoch time; records, every run (failed ones too)."""
    latency_free = one_machine_latency_free(usable)
    failed: dict[tuple[str, int], Counter] = defaultdict(Counter)
    succeeded: dict[tuple[str, int], Counter] = defaultdict(Counter)
    timed = set(usable)
    for r in records:
        if r.workers:
            (succeeded if r in timed else failed)[(r.instance_type, r.workers)][(r.batch_size, latency(r))] += 1
    return Runs(
        failed=dict(failed),
        succeeded=dict(succeeded),
        latency_free=latency_free,
        workers=tuple(sorted({r.workers for r in usable if r.workers})),
        batch_sizes=tuple(sorted({r.batch_size for r in usable if r.batch_size is not None})),
        latencies=tuple(sorted({latency(r) for r in usable if not (latency_free and r.workers == 1)})),
        priced=priced | {r.instance_type for r in usable},
        has_model=has_model,
    )


def latency(r: PerfRecord) -> float:
    return float(r.latency_ms or 0.0)


def unpriced(runs: Runs, point: Point) -> str:
    return "" if point[0] in runs.priced else f"{point[0]} has no runs and no catalogue speed"


def failed_here(runs: Runs, point: Point) -> str:
    worker_type, n, batch, lat = point
    failed = runs.failed.get((worker_type, n), Counter())
    if (batch, lat) in failed:
        return "a run of it failed at this point"
    ran = runs.succeeded.get((worker_type, n), Counter())
    if any(b == batch for b, _ in failed) and not any(b == batch for b, _ in ran):
        return "it only ever failed at this batch size"
    return ""


def one_machine_unmeasured(runs: Runs, point: Point) -> str:
    if point[1] == 1 and runs.latency_free and 1 not in runs.workers:
        return "no run measured one machine, and the runs of several cannot tell its computing from their collectives"
    return ""


def axis_never_varied(runs: Runs, point: Point) -> str:
    _, n, batch, lat = point
    if not runs.has_model:
        return ""  # outside_runs_without_model answers within the measured ranges only
    if len(runs.workers) == 1 and n != runs.workers[0]:
        return f"the runs measured only {runs.workers[0]} worker{'s' * (runs.workers[0] != 1)}"
    if batch is not None and len(runs.batch_sizes) == 1 and batch != runs.batch_sizes[0]:
        return f"the runs measured only batch size {runs.batch_sizes[0]:g}"
    if not (runs.latency_free and n == 1) and len(runs.latencies) == 1 and lat != runs.latencies[0]:
        return f"the runs measured only {runs.latencies[0]:g} ms latency"
    return ""


def outside_runs_without_model(runs: Runs, point: Point) -> str:
    if runs.has_model:
        return ""
    worker_type, n, batch, lat = point
    ranges = runs.ranges(worker_type)
    paid = 0.0 if runs.latency_free and n == 1 else lat
    within = ranges and all(
        x is None or low <= x <= high for x, (low, high) in zip((n, batch, paid), ranges, strict=True)
    )
    return "" if within else "it lies outside the measured ranges and too few runs fit a model to extrapolate with"


Guard = Callable[[Runs, Point], str]
GUARDS: tuple[Guard, ...] = (
    unpriced,
    failed_here,
    one_machine_unmeasured,
    axis_never_varied,
    outside_runs_without_model,
)


def refusal(runs: Runs, point: Point, guards: Sequence[Guard] = GUARDS) -> str:
    """Why this configuration is not answered: the first guard that refuses it ("" when none does)."""
    return next((reason for guard in guards if (reason := guard(runs, point))), "")


def warning(runs: Runs, point: Point) -> str:
    """Failed runs of this configuration near this point ("" when none): a warning, not a refusal."""
    worker_type, n, batch, lat = point
    return failure_risk(runs.failed.get((worker_type, n), {}), runs.succeeded.get((worker_type, n), {}), batch, lat)
