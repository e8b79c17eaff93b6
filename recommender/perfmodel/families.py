"""The model families: their forms, batch scalings, speed and loss modes, their design matrices, and the fitted
`PerfModel` that predicts from them.

Notation: n = workers, B = batch size, l = network latency (ms), type = worker instance type, speed_t = the catalogue's
ECU of the type (vCPU × the catalogue's median ECU per vCPU when ECU is "variable"). B enters every form through
b = B / B_ref, B_ref = the records' most common batch size, so coefficients are seconds per epoch at B_ref.

Model forms (every coefficient ≥ 0, fitted with scipy.optimize.nnls, so each term keeps its physical sign; predictions
are therefore positive and never decrease with latency):

- ``anwar-eq5`` — Anwar et al. eq. 5, t = o/x_n + l·r, generalised:
  t = θ_fixed + θ_epoch_n·n + κ_type·w(b)/n + s(b, n)·(θ_step + θ_lat·l·m(n) + θ_xfer·v(n)).
  κ_type·w/n is compute over the cluster's throughput; s counts steps per epoch; m(n) messages one after another and
  v(n) bytes sent per step; θ_epoch_n·n the epoch's own work for each worker (the roofline's, below). The pattern
  is the records' own: "ps" when most records name a PS or the ps strategy (m = 2, v = n: the PS link carries every
  worker's gradients), else "all-reduce" (v = 2(n−1)/n, none for n = 1), whose message law is part of the form (the
  name's part after "/"): ``tree`` — m = 2·log2 n, the latency term of Rabenseifner's all-reduce (Thakur,
  Rabenseifner & Gropp 2005: recursive halving then doubling, what collectives use when the messages are small and
  latency dominates); ``ring`` — m = 2(n−1), a ring's 2(n−1) steps. Where the records
  cannot tell the two apart (two worker counts, one of them a single machine), the tree stands: TensorFlow's
  collectives measured on the lab took 1.06× as long per epoch under latency at 3 workers as at 2 with the batch per
  replica (the median over recommender/data/lab-digits-grid.csv's cells), as the tree's 2·log2 n/n says (1.06×), not
  the ring's 2(n−1)/n (1.33×).
  A PS has a second law, ``roofline``: its server is shared, so the epoch takes as long as the slower of the workers'
  own work and what the server can serve (FC² §8: "increasing the cluster size does not help much as the parameter
  server's network capacity has been saturated"; the lab's PS runs at 20 ms and batch size 256: 1.30 s an epoch on one
  worker, 0.83 on two, 0.57 on three, 0.66 on four):
  t = θ_fixed + θ_epoch_n·n + (θ_epoch + θ_epoch_n_lat·n)·l + max(κ_type·w(b)/n + s(b, n)·(θ_step + θ_lat·l·2),
                                                                  s(b, n)·n·(θ_srv + θ_srv_lat·l)),
  the first the worker-bound piece (each worker's steps, two round trips each), the second the server-bound one (every
  worker's steps pass through one server); the rest is the epoch's own work: once, and for each worker in turn
  (Ernest's θ·n, here with its round trips: TensorFlow's coordinator sets up every worker each epoch — on the lab at
  batch size 256, 4 workers took 0.09 s longer an epoch than 3 at 20 ms and 0.19 s at 40 ms, with fewer steps each).
  Fitted by alternating between the two pieces (each record to the piece that bounds it, both refitted by NNLS on that
  split, from several starting splits: Magnani & Boyd's max-affine fitting).
- ``ernest`` — Venkataraman et al. (NSDI'16), t = θ0 + θ1·size/n + θ2·log n + θ3·n, extended the same way:
  t = θ0 + κ_type·w(b)/n + θ_e_logn·log2 n + θ_e_n·n + s(b)·(θ_logn·log2 n + θ_n·n + l·(θ_lat_logn·log2 n + θ_lat_n·n)):
  Ernest's own log n and n terms once an epoch (a tree's and each machine's set-up), and again on every step (with
  the latency's), so that a form whose steps grow with the batch still has costs that grow with n alone (once, where
  s = 1).

Each form comes with four readings of what an epoch is (the batch scaling, the part of the family name after ":"):
``replica`` — one pass over a fixed data set with B the batch of each worker (FC²'s and Shi's batch sizes, and
TensorFlow's strategies' per-replica batch): n·B samples a step, so s = 1/(n·b), w = 1; ``pass`` — the same with B the
whole cluster's batch: s = 1/b, w = 1; ``steps`` — a fixed number of steps: s = 1, w = b; ``samples`` — work and
messages both grow with b: s = w = b (Anwar's Table 4, where epoch time is roughly proportional to the batch size at
every n). Where the records cannot tell them apart, the first listed stands.
Speed: ``catalogue`` — one compute coefficient, κ_type = θ/speed_type; ``per-type`` — one free κ per measured type
(GPUs and burstable t2 do not follow their ECU); a type without records is priced through the catalogue as
median(κ_t·speed_t)/speed_type. Loss: ``absolute`` (plain NNLS) or ``relative`` (rows weighted 1/t, i.e. least
squares on relative error, close to a log-time fit under multiplicative noise, so small epochs count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from recommender.types import InstanceSpec, RecommendationError

SHAPES = ("anwar-eq5", "ernest")
# anwar-eq5's message laws for each pattern of the records, the one that stands where the records cannot tell first.
MESSAGE_LAWS = {"all-reduce": ("tree", "ring"), "ps": ("ps", "roofline")}
# The pieces of a form's columns: in every epoch, the worker-bound piece, the server-bound piece (only a roofline
# has one: its time is the common columns plus the larger of the other two; every other form adds all its columns).
COMMON, WORKER, SERVER = 0, 1, 2
# A roofline's shared columns (_shared_features) and the piece each belongs to; its compute column is the workers'.
ROOFLINE_PIECES = {
    "fixed_s": COMMON,
    "epoch_latency_s_per_ms": COMMON,
    "epoch_worker_latency_s_per_ms": COMMON,
    "epoch_worker_s": COMMON,
    "step_overhead_s": WORKER,
    "latency_s_per_ms": WORKER,
    "server_s": SERVER,
    "server_latency_s_per_ms": SERVER,
}
SCALINGS = ("replica", "pass", "steps", "samples")
SPEEDS = ("catalogue", "per-type")
LOSSES = ("relative", "absolute")


@dataclass(frozen=True)
class _Form:
    shape: str  # one of SHAPES
    scaling: str  # one of SCALINGS
    speed: str  # one of SPEEDS
    loss: str  # one of LOSSES
    messages: str = ""  # anwar-eq5's message law (MESSAGE_LAWS); ernest has its own terms

    @property
    def roofline(self) -> bool:
        return self.messages == "roofline"

    @property
    def family(self) -> str:
        law = f"/{self.messages}" if self.messages not in ("", "ps") else ""
        return f"{self.shape}{law}:{self.scaling}"

    @property
    def label(self) -> str:
        return f"{self.family} ({self.speed} speed, {self.loss} error)"


@dataclass(frozen=True)
class _Data:
    """Successful records as arrays (latency None = 0 ms: same data centre; batch None = B_ref)."""

    types: tuple[str, ...]
    workers: np.ndarray
    batch: np.ndarray  # B / B_ref
    latency: np.ndarray  # ms
    time: np.ndarray  # measured epoch time, s


@dataclass(frozen=True)
class PerfModel:
    """Epoch time of one workload as a function of worker type, worker count, batch size and latency."""

    family: str  # chosen form, message law and batch scaling, e.g. "anwar-eq5/tree:replica" (module docstring)
    speed: str  # "catalogue" or "per-type"
    loss: str  # "relative" or "absolute"
    cv_mape: float  # cross-validated mean absolute percentage error of epoch time (0.12 = 12 %)
    cv: str  # the cross-validation actually used, e.g. "leave-one-out over 27 records"
    coefficients: dict[str, float]  # name -> value in seconds (per ms for latency terms), for display
    alternatives: dict[str, float]  # CV MAPE of every form considered, by label
    records: int  # successful records fitted
    pattern: str  # "all-reduce" or "ps": how messages grow with n
    batch_ref: float | None  # B_ref; None when no record gives a batch size (batch then has no effect)
    latency_ref: float  # latency used when a prediction gives none: the records' most common, ms
    coverage: dict  # measured ranges: workers [min, max], batch_sizes, latencies_ms, worker_types
    form: _Form = field(repr=False)
    terms: _Fit = field(repr=False)  # the fitted coefficients as the predictor uses them

    def can_price(self, worker_type: str) -> bool:
        """True when the model can predict for this type (it has records, or a catalogue speed)."""
        return self.terms.kappa(worker_type) is not None

    def predict(self, worker_type: str, workers: int, batch_size: int | None, latency_ms: float | None) -> float:
        """Predicted epoch time in seconds; batch_size/latency_ms None mean the records' most common values."""
        if workers < 1:
            raise RecommendationError(f"cannot predict for {workers} workers: at least one is needed")
        if not self.can_price(worker_type):
            raise RecommendationError(
                f"the model cannot price worker type {worker_type!r}: it has no records and no catalogue speed"
            )
        return float(self.predict_many([worker_type], [workers], [batch_size], [latency_ms])[0])

    def predict_many(
        self,
        worker_types: Sequence[str],
        workers: Sequence[int],
        batch_sizes: Sequence[int | None],
        latencies_ms: Sequence[float | None],
    ) -> np.ndarray:
        """`predict` for many configurations at once (the i-th of each sequence), unchecked: NaN for a type the model
        cannot price (see can_price); workers must be at least 1."""
        n = np.asarray(workers, dtype=float)
        b = np.array([self._batch(x) for x in batch_sizes], dtype=float)
        lat = np.array([self.latency_ref if x is None else float(x) for x in latencies_ms], dtype=float)
        _, features = _shared_features(self.form, n, b, lat)
        time = self.terms.time(worker_types, features, _work(self.form.scaling, b) / n)
        return np.maximum(time, 1e-9)  # a sum of non-negative terms; the floor only guards an all-zero fit

    def saturates_from(
        self, worker_type: str, batch_size: int | None, latency_ms: float | None, up_to: int
    ) -> int | None:
        """A roofline's knee: the fewest workers (up to `up_to`) whom the server, not their own work, bounds at this
        batch size and latency — more workers train no faster from there. None for other forms, or past `up_to`."""
        if not self.terms.roofline or not self.can_price(worker_type):
            return None
        n = np.arange(1, up_to + 1, dtype=float)
        b = np.full_like(n, self._batch(batch_size))
        lat = np.full_like(n, self.latency_ref if latency_ms is None else float(latency_ms))
        _, features = _shared_features(self.form, n, b, lat)
        worker, server = self.terms.bounds([worker_type] * up_to, features, _work(self.form.scaling, b) / n)
        bound = np.flatnonzero(server >= worker)
        return int(n[bound[0]]) if bound.size else None

    def _batch(self, batch_size: int | None) -> float:
        if self.batch_ref is None or batch_size is None:
            return 1.0
        return float(batch_size) / self.batch_ref


# --- features -----------------------------------------------------------------------------------------------------


def _steps(scaling: str, b: np.ndarray, n: np.ndarray) -> np.ndarray:
    return {"replica": 1.0 / (b * n), "pass": 1.0 / b, "steps": np.ones_like(b), "samples": b}[scaling]


def _work(scaling: str, b: np.ndarray) -> np.ndarray:
    return np.ones_like(b) if scaling in ("replica", "pass") else b


def _shared_features(form: _Form, n: np.ndarray, b: np.ndarray, lat: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    """The type-independent columns of a form (the compute column is added per speed mode)."""
    s = _steps(form.scaling, b, n)
    if form.roofline:
        columns = {
            "fixed_s": np.ones_like(n),
            "epoch_latency_s_per_ms": lat,
            "epoch_worker_latency_s_per_ms": lat * n,
            "epoch_worker_s": n,
            "step_overhead_s": s,
            "latency_s_per_ms": s * lat * 2.0,
            "server_s": s * n,
            "server_latency_s_per_ms": s * n * lat,
        }
    elif form.shape == "anwar-eq5":
        if form.messages == "ps":
            messages, volume = np.full_like(n, 2.0), n
        else:
            messages = 2.0 * np.log2(n) if form.messages == "tree" else 2.0 * (n - 1.0)
            volume = 2.0 * (n - 1.0) / n
        columns = {
            "fixed_s": np.ones_like(n),
            "epoch_worker_s": n,
            "step_overhead_s": s,
            "latency_s_per_ms": s * lat * messages,
            "transfer_s": s * volume,
        }
    else:
        log_n = np.log2(n)
        columns = {
            "fixed_s": np.ones_like(n),
            **({} if form.scaling == "steps" else {"epoch_log_n_s": log_n, "epoch_n_s": n}),
            "log_n_s": s * log_n,
            "n_s": s * n,
            "latency_log_n_s_per_ms": s * lat * log_n,
            "latency_n_s_per_ms": s * lat * n,
        }
    return tuple(columns), np.column_stack(list(columns.values()))


def _pieces(names: Sequence[str]) -> np.ndarray:
    """Each of a roofline's shared columns' piece (ROOFLINE_PIECES)."""
    return np.array([ROOFLINE_PIECES[name] for name in names])


def _catalog_speeds(catalog: Sequence[InstanceSpec]) -> dict[str, float]:
    """speed_t per type: ECU, else vCPU × the catalogue's median ECU per vCPU (t2's "variable" ECU)."""
    per_vcpu = [s.ecu / s.vcpu for s in catalog if s.ecu and s.vcpu]
    ecu_per_vcpu = float(np.median(per_vcpu)) if per_vcpu else None
    speeds = {}
    for spec in catalog:
        if spec.ecu:
            speeds[spec.name] = float(spec.ecu)
        elif spec.vcpu and ecu_per_vcpu:
            speeds[spec.name] = spec.vcpu * ecu_per_vcpu
    return speeds


@dataclass(frozen=True)
class _Fit:
    shared: np.ndarray  # coefficients of the type-independent features
    compute_s: dict[str, float]  # κ of each measured type (per-type speed)
    compute_per_speed: float | None  # θ with κ = θ / speed (catalogue speed, and bridging unmeasured types)
    speeds: dict[str, float]  # catalogue speed per type
    pieces: np.ndarray | None = None  # a roofline's piece of each shared column (_pieces); None: every column adds

    def kappa(self, worker_type: str) -> float | None:
        if worker_type in self.compute_s:
            return self.compute_s[worker_type]
        if self.compute_per_speed is not None and worker_type in self.speeds:
            return self.compute_per_speed / self.speeds[worker_type]
        return None

    def time(self, types: Sequence[str], shared_features: np.ndarray, work_per_worker: np.ndarray) -> np.ndarray:
        if not self.roofline:
            return shared_features @ self.shared + self._compute(types, work_per_worker)
        common = shared_features[:, self.pieces == COMMON] @ self.shared[self.pieces == COMMON]
        return common + np.maximum(*self.bounds(types, shared_features, work_per_worker))

    @property
    def roofline(self) -> bool:
        return self.pieces is not None

    def bounds(
        self, types: Sequence[str], shared_features: np.ndarray, work_per_worker: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """A roofline's two pieces: the workers' own time and the server's (beyond the common columns)."""
        worker = shared_features[:, self.pieces == WORKER] @ self.shared[self.pieces == WORKER]
        server = shared_features[:, self.pieces == SERVER] @ self.shared[self.pieces == SERVER]
        return worker + self._compute(types, work_per_worker), server

    def _compute(self, types: Sequence[str], work_per_worker: np.ndarray) -> np.ndarray:
        per_type = {t: np.nan if (k := self.kappa(t)) is None else k for t in set(types)}
        return np.array([per_type[t] for t in types], dtype=float) * work_per_worker


def _design(
    form: _Form, data: _Data, speeds: dict[str, float], measured: tuple[str, ...]
) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    names, shared = _shared_features(form, data.workers, data.batch, data.latency)
    work = _work(form.scaling, data.batch) / data.workers
    if form.speed == "catalogue":
        compute = (work / np.array([speeds[t] for t in data.types]))[:, None]
    else:
        compute = np.column_stack([work * np.array([t == m for t in data.types]) for m in measured])
    return names, shared, compute
