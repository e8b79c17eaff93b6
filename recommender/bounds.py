"""The physical bounds of every figure a performance record holds: the one place they are stated.

A record's figures come from hostile or unlucky places — a job's own `metrics.json`, a file someone imports, a row
written around the platform — and the algorithms divide by them, average them and take their logarithms. A figure
outside its bound is no measurement of any cluster: it is refused at every door that writes records (a job's
feedback, `import_perf_data`, the admin) and skipped by every answer that reads them (recommender/service.py), so
that no record can make an answer overflow, divide by zero, or carry NaN or infinity into JSON.

The bounds are what a run on any machine could measure, not what the shipped grids hold (those are far inside them):

- epoch_time_s, 1 ms to a week: an epoch is at least one distributed step (a kernel's and a network's round trip);
  a job runs for hours at most (its deadline), an imported run not for weeks.
- step_time_s, 1 µs to a week: one step of any device, and no longer than an epoch may be.
- bandwidth_mbps, 1 kbit/s to 1 Tbit/s: a worker that sends less is not training over a network; no NIC sends more.
- cpu_util, 0 to 100: a share of the node's CPUs, in %.
- latency_ms, 0 to a minute: one way; no network's is longer, and past it the models' exponentials overflow.
- batch_size, 1 to 2³¹ − 1: what a record's integer column holds on PostgreSQL.
- workers, 1 to 10,000: a cluster the platform could provision.
- loss, 0 to 10³⁰: a mean of per-example losses (cross-entropy, squared error) is never negative; past 10³⁰ the
  training diverged, and the figure is no number to show or sum.

Pure Python, no Django: the algorithms' side of the recommender may use it, and the service turns it into a query.

>>> out_of_bounds({"epoch_time_s": 1e308, "workers": 2, "cpu_util": None})
['epoch_time_s 1e+308 is not within 0.001–604800 s']
>>> out_of_bounds({"epoch_time_s": float("nan"), "workers": 10**400})
['epoch_time_s nan is not within 0.001–604800 s', 'workers of 401 digits is not within 1–10000']
>>> out_of_bounds({"batch_size": 0, "latency_ms": -0.5})
['latency_ms -0.5 is not within 0–60000 ms', 'batch_size 0 is not within 1–2147483647']
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

WEEK_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class Bound:
    low: float  # the least value a record may hold (inclusive)
    high: float  # the greatest (inclusive)
    unit: str = ""  # as a message writes it after the range ("s", "Mbps", "%", "ms")
    integer: bool = False  # a whole number (a count)

    def holds(self, value: object) -> bool:
        """Whether `value` is a finite number within the bound (a whole number where the bound says so); None, an
        absent figure, is no figure to bound and holds."""
        if value is None:
            return True
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if isinstance(value, int):  # (compared as it is: a float of a 400-digit integer would overflow)
            return self.low <= value <= self.high
        if self.integer and not value.is_integer():
            return False
        return math.isfinite(value) and self.low <= value <= self.high

    def text(self) -> str:
        """'0.001–604800 s'"""
        low, high = (f"{v}" if self.integer else f"{v:g}" for v in (self.low, self.high))
        return f"{low}–{high}{f' {self.unit}' if self.unit else ''}"


MAX_BATCH_SIZE = 2**31 - 1
MAX_LATENCY_MS = 60_000.0
MAX_WORKERS = 10_000

BOUNDS: dict[str, Bound] = {
    "epoch_time_s": Bound(1e-3, WEEK_S, "s"),
    "step_time_s": Bound(1e-6, WEEK_S, "s"),
    "bandwidth_mbps": Bound(1e-3, 1e6, "Mbps"),
    "cpu_util": Bound(0.0, 100.0, "%"),
    "latency_ms": Bound(0.0, MAX_LATENCY_MS, "ms"),
    "batch_size": Bound(1, MAX_BATCH_SIZE, integer=True),
    "workers": Bound(1, MAX_WORKERS, integer=True),
    "loss": Bound(0.0, 1e30),
}


def out_of_bounds(figures: Mapping[str, object]) -> list[str]:
    """What is wrong with each bounded figure among `figures` (a record's fields by name), in BOUNDS' order; [] when
    every figure is within its bound or absent."""
    return [
        f"{name} {_shown(figures[name])} is not within {bound.text()}"
        for name, bound in BOUNDS.items()
        if name in figures and not bound.holds(figures[name])
    ]


def _shown(value: object) -> str:
    """A figure as a message shows it: short, whatever it is (a 5,000-digit integer is not printed whole)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"of {len(str(abs(value)))} digits"
    text = f"{value:g}" if isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
