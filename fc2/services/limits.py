"""The limits a job runs under, and the one rule that stops it: a limit crossed → stopped, with the reason.

Pure: figures in, a reason out — no database and no clock. The sweep (fc2/services/sweep.py) measures a job, asks
here, and stops the job when told why.

- The time limit (FC2_JOB_TIMEOUT_S), counted from the start of the run, or from submission before it: crossed once
  the job has been going longer.
- The whole-job budget (Job.total_budget), $ at the catalogue's prices for every node of the cluster, the PS included,
  billed from its launch to the end of its teardown: the sweep looks only every FC2_SWEEP_INTERVAL_S, and the
  cluster costs until its teardown has ended, so a job is stopped at the last look before its cost would reach the
  budget — when cost so far + $/h × (interval + teardown time) ≥ budget. The teardown time is what the provider's
  teardowns took lately on this installation (fc2/services/sweep.py measures it).
"""

from __future__ import annotations

from common.numbers import usd


def limit_crossed(
    *,
    run_s: float,
    time_limit_s: int,
    cost_so_far: float | None = None,
    hourly_cost: float | None = None,
    budget: float | None = None,
    interval_s: float = 0.0,
    teardown_s: float = 0.0,
) -> str | None:
    """Why a job must be stopped now, or None: it has been going for `run_s` past its `time_limit_s`, or its cost
    would reach its `budget` before a teardown that began at the next look, `interval_s` from now, and takes
    `teardown_s`, had ended. A job with no price, or none billed yet, has no cost to hold against a budget.

    >>> limit_crossed(run_s=61, time_limit_s=60)
    'timed out after 60 s'
    >>> limit_crossed(run_s=60, time_limit_s=60) is None
    True
    >>> limit_crossed(run_s=10, time_limit_s=60, cost_so_far=0.996, hourly_cost=3.6, budget=1.0, interval_s=5)
    "stopped: the job's cost would exceed its budget of $1.00 (cost so far $0.996)"
    >>> limit_crossed(run_s=10, time_limit_s=60, cost_so_far=0.99, hourly_cost=3.6, budget=1.0, interval_s=5) is None
    True
    >>> limit_crossed(run_s=10, time_limit_s=60, cost_so_far=0.97, hourly_cost=3.6, budget=1.0, interval_s=5) is None
    True
    >>> limit_crossed(run_s=10, time_limit_s=60, cost_so_far=0.97, hourly_cost=3.6, budget=1.0, interval_s=5,
    ...               teardown_s=25)  # $3.6/h for 5 + 25 s is $0.03
    "stopped: the job's cost would exceed its budget of $1.00 (cost so far $0.97)"
    >>> limit_crossed(run_s=10, time_limit_s=60, cost_so_far=None, hourly_cost=3.6, budget=0.01, interval_s=5) is None
    True
    """
    if run_s > time_limit_s:
        return f"timed out after {time_limit_s} s"
    if budget is None or cost_so_far is None or hourly_cost is None:
        return None
    if cost_so_far + hourly_cost * (interval_s + teardown_s) / 3600 >= budget:
        return f"stopped: the job's cost would exceed its budget of {usd(budget)} (cost so far {usd(cost_so_far)})"
    return None
