"""Fitting a workload's model: cross-validation, the choice of family and the final fit on every record.

How the family is chosen: every applicable combination (anwar-eq5 with each message law of the records' pattern, and
ernest; × 4 scalings × 2 speeds × 2 losses) is scored by cross-validated MAPE — leave-one-out (10 seeded folds above
50 records), or leave-one-group-out (one latency, worker count, batch size or worker type at a time) when asked and at
least 3 groups exist. The chosen combination is the one with the fewest coefficients among those within 0.5 percentage
points of the best MAPE (parsimony extrapolates better), then the best MAPE among those, then — between forms the
records cannot tell apart — the one listed first (`_forms`: the tree before the ring, the batch per replica before the
cluster's); then refitted on every record. Failed runs (epoch_time_s None) are never fitted as times (the predictor
reads them: recommender.perfmodel.predictor).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from scipy.optimize import nnls
from sklearn.metrics import mean_absolute_percentage_error
from sklearn.model_selection import KFold, LeaveOneGroupOut, LeaveOneOut

from recommender.algorithms import one_machine_latency_free
from recommender.perfmodel.families import (
    COMMON,
    LOSSES,
    MESSAGE_LAWS,
    SCALINGS,
    SERVER,
    SHAPES,
    SPEEDS,
    WORKER,
    PerfModel,
    _catalog_speeds,
    _Data,
    _design,
    _Fit,
    _Form,
    _pieces,
    _work,
)
from recommender.types import InstanceSpec, PerfRecord, RecommendationError

MIN_RECORDS = 4  # fewer successful runs cannot cross-validate even the smallest form
LOO_LIMIT = 50  # above this, leave-one-out becomes 10 seeded folds: nearly the same estimate, far fewer fits
FOLDS = 10
MIN_GROUPS = 3  # leave-one-group-out needs at least two groups left to learn the held-out axis from
PARSIMONY_MAPE = 0.005  # forms within 0.5 pp of the best CV MAPE count as equally good: the smallest one wins
# CV MAPEs this close are the same fit told apart by rounding alone (two message laws that agree on every measured
# worker count): the form listed first stands, not whichever the rounding favoured.
SAME_FIT_MAPE = 1e-6
ROOFLINE_KNEES = 4  # a roofline's starting splits: at most this many measured counts spread over them (_System)
ROOFLINE_ROUNDS = 20  # a roofline's alternation stops sooner when no record changes piece (_System)

# How calibration_report and fit(cv=...) group records: name -> key of a record.
GROUPINGS: dict[str, Callable[[PerfRecord], object]] = {
    "latency": lambda r: float(r.latency_ms or 0.0),
    "workers": lambda r: r.workers,
    "batch_size": lambda r: r.batch_size,
    "type": lambda r: r.instance_type,
}


class _System:
    """A form's least-squares system over every record, weighted for its loss, so that each fold only takes its rows;
    each fit scales its rows' columns to at most 1 (NNLS converges on columns of like size), from those rows alone.

    A roofline (pieces given: each column's piece, families.COMMON / WORKER / SERVER) is fitted by alternating: each
    row is put on the piece that bounds it, the other piece's columns are zeroed in that row, one NNLS fits the split,
    and the rows are put again by the new fit, until no row moves. It starts from every split "the server bounds the
    runs of k workers and more" (k each measured count above the least, or ROOFLINE_KNEES of them spread evenly) and
    from "no row is server-bound"; the fit with the least squared error of its max() stands. Nothing of a held-out
    record reaches a fold's fit: not its time, nor its columns' scale, nor a split some fit on it made (starting each
    fold from the split of the fit on every record would be faster, but would lend it what that fit learnt)."""

    def __init__(
        self, matrix: np.ndarray, time: np.ndarray, loss: str, pieces: np.ndarray | None = None,
        workers: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        weight = 1.0 / time if loss == "relative" else np.ones_like(time)
        self.a, self.b = matrix * weight[:, None], time * weight
        self.pieces, self.workers = pieces, workers
        if pieces is not None:
            self.common, self.worker, self.server = (pieces == piece for piece in (COMMON, WORKER, SERVER))

    def solve(self, rows: np.ndarray) -> np.ndarray:
        """The coefficients fitted to these rows."""
        scale = np.abs(self.a[rows]).max(axis=0)
        scale[scale == 0] = 1.0  # a feature that is zero on every row (e.g. latency when all runs at 0 ms)
        a, b = self.a[rows] / scale, self.b[rows]
        if self.pieces is None:
            return self._nnls(a, b) / scale
        workers = np.asarray(self.workers)[rows]  # (a roofline's system is given its workers)
        counts = np.unique(workers)[1:]
        if len(counts) > ROOFLINE_KNEES:
            counts = counts[np.linspace(0, len(counts) - 1, ROOFLINE_KNEES).round().astype(int)]
        starts = [np.zeros(len(rows), dtype=bool)] + [workers >= k for k in counts]
        seen: set[bytes] = set()  # splits fitted from an earlier start: going on from one again finds nothing new
        fits = [self._alternate(a, b, split, seen) for split in starts]
        return min(fits, key=lambda fit: fit[0])[1] / scale

    def _alternate(self, a: np.ndarray, b: np.ndarray, split: np.ndarray, seen: set) -> tuple[float, np.ndarray | None]:
        """A roofline's alternation from one split: its least squared error and that fit (None: no new split)."""
        best: tuple[float, np.ndarray | None] = (np.inf, None)
        for _ in range(ROOFLINE_ROUNDS):
            if (key := split.tobytes()) in seen:
                break
            seen.add(key)
            error, coef, moved = self._split_fit(a, b, split)
            best = min(best, (error, coef), key=lambda fit: fit[0])
            split = moved
        return best

    def _nnls(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return nnls(a, b, maxiter=50 * a.shape[1])[0]

    def _split_fit(self, a: np.ndarray, b: np.ndarray, on_server: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """One NNLS with each row on its piece: the squared error of the fit's max(), the fit, and its own split."""
        coef = self._nnls(a * np.where(on_server[:, None], ~self.worker, ~self.server), b)
        common, bound, moved = self._bounds(a, coef)
        return float(np.sum((common + bound - b) ** 2)), coef, moved

    def _bounds(self, a: np.ndarray, coef: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A roofline's common part, its bound (the larger piece) and where the server is that bound."""
        by_worker, by_server = a[:, self.worker] @ coef[self.worker], a[:, self.server] @ coef[self.server]
        return a[:, self.common] @ coef[self.common], np.maximum(by_worker, by_server), by_server > by_worker


def _fit_rows(
    form: _Form, system: _System, k: int, rows: np.ndarray, present: set, measured: tuple[str, ...],
    speeds: dict[str, float],
) -> _Fit:  # fmt: skip
    """The form fitted to these rows of its system (shared columns first, k of them; then compute); present: the
    worker types of those rows."""
    coef = system.solve(rows)
    pieces = None if system.pieces is None else system.pieces[:k]
    if form.speed == "catalogue":
        return _Fit(coef[:k], {}, float(coef[k]), speeds, pieces)
    compute_s = {t: float(c) for t, c in zip(measured, coef[k:], strict=True) if t in present}
    bridges = [c * speeds[t] for t, c in compute_s.items() if t in speeds]
    return _Fit(coef[:k], compute_s, float(np.median(bridges)) if bridges else None, speeds, pieces)


def _usable(records: Sequence[PerfRecord]) -> list[PerfRecord]:
    return [r for r in records if r.epoch_time_s is not None and r.epoch_time_s > 0 and r.workers and r.workers >= 1]


def _pattern(records: Sequence[PerfRecord]) -> str:
    return "all-reduce" if one_machine_latency_free(records) else "ps"


def _most_common(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(Counter(present).most_common(1)[0][0]) if present else None


def _folds(records: list[PerfRecord], cv: str) -> tuple[list[np.ndarray], str]:
    """The held-out index sets (scikit-learn's splitters) and how to say which cross-validation they are."""
    count = len(records)
    if cv != "loo":
        keys = [str(GROUPINGS[cv](r)) for r in records]
        groups = len(set(keys))
        if groups >= MIN_GROUPS:
            folds = [test for _, test in LeaveOneGroupOut().split(np.zeros(count), groups=keys)]
            return folds, f"leave-one-{cv}-out over {groups} groups ({count} records)"
        fallback = f" (only {groups} {cv} group{'s' * (groups != 1)}: leave-one-{cv}-out needs {MIN_GROUPS})"
    else:
        fallback = ""
    if count <= LOO_LIMIT:
        folds = [test for _, test in LeaveOneOut().split(np.zeros(count))]
        return folds, f"leave-one-out over {count} records{fallback}"
    folds = [test for _, test in KFold(FOLDS, shuffle=True, random_state=0).split(np.zeros(count))]
    return folds, f"{FOLDS}-fold over {count} records{fallback}"


def fit(
    records: Sequence[PerfRecord], catalog: Sequence[InstanceSpec] = (), *, cv: str = "loo", form: _Form | None = None
) -> PerfModel:
    """Fit every candidate form, keep the one with the best cross-validated MAPE (module docstring).

    cv: "loo", or "latency" / "workers" / "batch_size" / "type" for leave-one-group-out. form: refit this form alone
    (a chosen model's `form`, on other records: the predictor's hold-out keeps the family it chose on every run). The
    same records and catalogue (they are frozen, so hashable) give the same model: fits are memoised, since a request
    recommends from a workload whose records rarely change between requests.
    """
    return _fit(tuple(records), tuple(catalog), cv, form)


@functools.lru_cache(maxsize=256)
def _fit(records: tuple[PerfRecord, ...], catalog: tuple[InstanceSpec, ...], cv: str, only: _Form | None) -> PerfModel:
    if cv != "loo" and cv not in GROUPINGS:
        raise ValueError(f"unknown cross-validation {cv!r}: use 'loo' or one of {', '.join(GROUPINGS)}")
    usable = _usable(records)
    if len(usable) < MIN_RECORDS:
        failed = sum(1 for r in records if r.epoch_time_s is None)
        raise RecommendationError(
            f"too few performance records to fit a model: {len(usable)} with an epoch time"
            f"{f' ({failed} failed runs skipped)' if failed else ''}, at least {MIN_RECORDS} needed"
        )
    speeds = _catalog_speeds(catalog)
    batch_ref = _most_common(r.batch_size for r in usable)
    data = _Data(
        types=tuple(r.instance_type for r in usable),
        workers=np.array([r.workers for r in usable], dtype=float),
        batch=np.array([(r.batch_size or batch_ref or 1.0) / (batch_ref or 1.0) for r in usable], dtype=float),
        latency=np.array([r.latency_ms or 0.0 for r in usable], dtype=float),
        time=np.array([r.epoch_time_s for r in usable], dtype=float),
    )
    measured = tuple(sorted(set(data.types)))
    pattern = _pattern(usable)
    folds, cv_text = ([], "refitted in the form chosen before") if only else _folds(usable, cv)
    everything = np.arange(len(usable))
    # Each fold's training rows and their worker types, the same for every form.
    splits = [(train := np.setdiff1d(everything, test), test, {data.types[i] for i in train}) for test in folds]

    scored = []  # (coverage, mape, parameters, order, form, (names, shared columns, system))
    for order, form in enumerate([only] if only else _forms(measured, speeds, pattern)):
        names, shared, compute = _design(form, data, speeds, measured)
        pieces = np.concatenate([_pieces(names), np.full(compute.shape[1], WORKER)]) if form.roofline else None
        system = _System(np.hstack([shared, compute]), data.time, form.loss, pieces, data.workers)
        if only:  # its form chosen already: nothing to cross-validate
            scored.append((1.0, math.nan, 0, order, form, (names, shared, system)))
            continue
        predicted = np.full(len(usable), np.nan)
        for train, test, present in splits:
            fold_fit = _fit_rows(form, system, shared.shape[1], train, present, measured, speeds)
            work = _work(form.scaling, data.batch[test]) / data.workers[test]
            predicted[test] = fold_fit.time([data.types[i] for i in test], shared[test], work)
        priced = ~np.isnan(predicted)
        if not priced.any():
            continue
        mape = float(mean_absolute_percentage_error(data.time[priced], predicted[priced]))
        parameters = shared.shape[1] + compute.shape[1]
        scored.append((priced.mean(), mape, parameters, order, form, (names, shared, system)))
    if not scored:
        raise RecommendationError(
            "cannot cross-validate a model: every worker type has a single record and the catalogue gives no speed"
        )
    coverage, chosen = _choice(scored)
    _, mape, _, _, form, (names, shared, system) = chosen
    if coverage < 1:
        cv_text += f"; {coverage:.0%} of held-out records could be priced"

    final = _fit_rows(form, system, shared.shape[1], everything, set(measured), measured, speeds)
    coefficients = {name: float(c) for name, c in zip(names, final.shared, strict=True)}
    if form.speed == "catalogue":
        coefficients["compute_s_x_speed"] = float(final.compute_per_speed or 0.0)
    else:
        coefficients.update({f"compute_s[{t or 'unnamed type'}]": c for t, c in final.compute_s.items()})
    return PerfModel(
        family=form.family,
        speed=form.speed,
        loss=form.loss,
        cv_mape=mape,
        cv=cv_text,
        coefficients=coefficients,
        alternatives={s[4].label: s[1] for s in scored},
        records=len(usable),
        pattern=pattern,
        batch_ref=batch_ref,
        latency_ref=_most_common(float(r.latency_ms or 0.0) for r in usable) or 0.0,
        coverage={
            "workers": [int(data.workers.min()), int(data.workers.max())],
            "batch_sizes": sorted({r.batch_size for r in usable if r.batch_size is not None}),
            "latencies_ms": sorted({float(r.latency_ms or 0.0) for r in usable}),
            "worker_types": list(measured),
        },
        form=form,
        terms=final,
    )


def _choice(scored: list) -> tuple[float, tuple]:
    """The share of held-out records priced, and the form chosen (module docstring): of those pricing the most, the
    fewest coefficients within PARSIMONY_MAPE of the best MAPE, then the best MAPE, then the one listed first."""
    coverage = max(s[0] for s in scored)
    complete = [s for s in scored if s[0] == coverage]
    if len(complete) == 1:  # (a form refitted: its MAPE not measured)
        return coverage, complete[0]
    best = min(s[1] for s in complete)
    band = [s for s in complete if s[1] <= best + PARSIMONY_MAPE]
    fewest = min(s[2] for s in band)
    smallest = [s for s in band if s[2] == fewest]
    closest = min(s[1] for s in smallest)
    return coverage, min((s for s in smallest if s[1] <= closest + SAME_FIT_MAPE), key=lambda s: s[3])


def _forms(measured: tuple[str, ...], speeds: dict[str, float], pattern: str) -> list[_Form]:
    """Every candidate, in the order that breaks ties: where the records cannot tell two apart, the earlier stands."""
    speed_modes = [m for m in SPEEDS if m != "catalogue" or all(t in speeds for t in measured)]
    return [
        _Form(shape, scaling, speed, loss, messages)
        for shape in SHAPES
        for messages in (MESSAGE_LAWS[pattern] if shape == "anwar-eq5" else ("",))
        for scaling in SCALINGS
        for speed in speed_modes
        for loss in LOSSES
    ]
