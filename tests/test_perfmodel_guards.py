"""The guards (recommender/perfmodel/guards.py): which configurations the predictor answers at all, and why not — each
guard on its own, table-driven, then the list in its order."""

from __future__ import annotations

import pytest

from recommender.perfmodel import guards
from recommender.types import PerfRecord


def facts(*rows, strategy="mirrored", priced=frozenset(), has_model=True) -> guards.Runs:
    """(type, workers, batch size, latency ms, epoch time s or None) rows as the guards see them."""
    records = [PerfRecord("w", t, "", n, b, lat, time, strategy=strategy) for t, n, b, lat, time in rows]
    usable = [r for r in records if r.epoch_time_s]
    return guards.runs_of(usable, records, frozenset(priced), has_model)


GRID = facts(*[("a", n, b, lat, 10.0) for n in (1, 2, 4) for b in (32, 64) for lat in (0.0, 20.0)],
             ("a", 4, 128, 0.0, None), ("a", 2, 128, 20.0, None), ("a", 2, 128, 0.0, 9.0))  # fmt: skip
ONE_OF_EACH = facts(("a", 3, 64, 20.0, 10.0), ("a", 3, 64, 20.0, 11.0))
SEVERAL = facts(*[("a", n, 64, lat, 10.0) for n in (2, 3) for lat in (0.0, 20.0)])
FEW = facts(("a", 2, 32, 0.0, 10.0), ("a", 2, 64, 20.0, 8.0), ("a", 4, 64, 20.0, 7.0), has_model=False)


@pytest.mark.parametrize(
    ("guard", "runs", "point", "reason"),
    [
        (guards.unpriced, GRID, ("a", 8, 64, 0.0), ""),
        (guards.unpriced, GRID, ("z", 2, 64, 0.0), "z has no runs and no catalogue speed"),
        (guards.unpriced, facts(("a", 2, 64, 0.0, 9.0), priced={"z"}), ("z", 2, 64, 0.0), ""),
        (guards.failed_here, GRID, ("a", 4, 128, 0.0), "a run of it failed at this point"),
        (guards.failed_here, GRID, ("a", 4, 128, 40.0), "it only ever failed at this batch size"),
        (guards.failed_here, GRID, ("a", 2, 128, 40.0), ""),  # it also ran there
        (guards.failed_here, GRID, ("a", 4, 64, 0.0), ""),
        (
            guards.one_machine_unmeasured,
            SEVERAL,
            ("a", 1, 64, 0.0),
            "no run measured one machine, and the runs of several cannot tell its computing from their collectives",
        ),  # fmt: skip
        (guards.one_machine_unmeasured, SEVERAL, ("a", 2, 64, 0.0), ""),
        (guards.one_machine_unmeasured, GRID, ("a", 1, 64, 0.0), ""),
        (guards.axis_never_varied, ONE_OF_EACH, ("a", 4, 64, 20.0), "the runs measured only 3 workers"),
        (guards.axis_never_varied, ONE_OF_EACH, ("a", 3, 32, 20.0), "the runs measured only batch size 64"),
        (guards.axis_never_varied, ONE_OF_EACH, ("a", 3, 64, 0.0), "the runs measured only 20 ms latency"),
        (guards.axis_never_varied, ONE_OF_EACH, ("a", 3, 64, 20.0), ""),
        (guards.axis_never_varied, GRID, ("a", 8, 512, 80.0), ""),
        (guards.outside_runs_without_model, FEW, ("a", 3, 48, 10.0), ""),
        (
            guards.outside_runs_without_model,
            FEW,
            ("a", 8, 64, 0.0),
            "it lies outside the measured ranges and too few runs fit a model to extrapolate with",
        ),  # fmt: skip
        (guards.outside_runs_without_model, GRID, ("a", 8, 64, 0.0), ""),
    ],
)
def test_each_guard(guard, runs, point, reason):
    assert guard(runs, point) == reason


def test_the_first_guard_that_refuses_says_why_and_a_failure_nearby_only_warns():
    assert guards.refusal(GRID, ("z", 4, 128, 0.0)) == "z has no runs and no catalogue speed"
    assert guards.refusal(GRID, ("a", 4, 128, 0.0)) == "a run of it failed at this point"
    assert guards.refusal(GRID, ("a", 4, 96, 0.0)) == ""
    assert guards.warning(GRID, ("a", 4, 96, 0.0)) == "1 run failed at batch size 128, 0 ms"
    assert guards.warning(GRID, ("a", 4, 32, 0.0)) == ""  # a failure at 128 reaches down to 64 only


def test_through_a_ps_one_machine_pays_the_latency():
    """One machine of an all-reduce workload sends nothing, so its latency is none; through a PS it is paid."""
    assert guards.runs_of([], [], frozenset(), True).latency_free
    through_ps = facts(*[("a", n, 64, lat, 10.0) for n in (2, 3) for lat in (0.0, 20.0)], strategy="ps")
    assert not through_ps.latency_free and guards.one_machine_unmeasured(through_ps, ("a", 1, 64, 0.0)) == ""
