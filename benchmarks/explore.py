"""Replay benchmark of `explore`'s search (recommender/explore.py) on a grid of measured runs (issue 44 §3).

    python benchmarks/explore.py --grid recommender/data/lab-digits-ps-grid.csv [--catalog FILE.json] [--seeds N]
        [--alpha A --beta B | --preset fastest|cheapest|balanced] [--transfer] [--at-once K] [--json]

FILE.csv is in `import_perf_data`'s csv format. Each (workload, batch size) in it is one search problem (the user's
batch size is fixed, so a grid measured at several batch sizes holds one problem per size); its configurations are
its distinct (instance_type, ps_type, workers, strategy, latency_ms). A trial at a configuration answers one of that
configuration's runs drawn at random (a failed run fails the trial) and costs the cluster's $/h over the trial
window. A grid in the anwar2021 format (headerless rows, told from the csv's header unless --format says; no
instance type) is read through the import's parser, filed under samples.toml's workload or the file's name:
its rows are the csv columns with an empty instance type and strategy mirrored; no catalogue prices that type, so
it costs --unpriced $/h a node (1 by default; the report says so) and cost then follows the worker count.

Types are priced from every bundled catalogue (recommender/catalogs/*.json) by default, or from --catalog alone.
Side by side, in the same run and with the same draws: `explore` (the search under test; with --transfer it sees
the file's other workloads' records as history), `random` (as many trials as explore made for that problem and seed,
at random, the best measured chosen), and `cherrypick` (CherryPick-style BO: a GP with a Matérn kernel fitted to the
trials, plain expected improvement, three random starts, stopping once the best EI is under 10 % of the best
objective after at least 6 trials — CherryPick's rule — or when every configuration is tried).

With --at-once K explore proposes up to K trials at a time (next_step's width) that run together; random's trials
run K at a time too; CherryPick's one after another, as published. A search's minutes are its wall-clock: one trial
window per batch.

Regret is the chosen configuration's objective (α·t/t* + β·c/c*, t and c its runs' mean epoch time and cost, t*
and c* the grid's least) over the grid's best, minus 1; cost is the trials' $ as a share of running every
configuration once. Goal (issue 44): within 5 % of best in ≥ 90 % of searches, median ≤ 4 trials, cost < 10 %.
`--json` prints one JSON object on stdout and nothing else.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from benchmarks._django import setup_django  # noqa: E402
from benchmarks.model_calibration import read_grid, shipped_grids  # noqa: E402
from recommender import explore  # noqa: E402
from recommender.types import InstanceSpec, PerfRecord  # noqa: E402

GOAL_WITHIN = 0.05
GOAL_SHARE = 0.90
GOAL_TRIALS = 4
GOAL_COST = 0.10
CHERRYPICK_STARTS = 3
CHERRYPICK_MIN_TRIALS = 6
CHERRYPICK_EI_SHARE = 0.10


@dataclass(frozen=True)
class Problem:
    name: str  # workload@B=batch
    runs: Mapping[explore.Config, tuple[float | None, ...]]  # every run of each configuration (None: failed)


def load_catalog(paths: Sequence[Path]) -> dict[str, InstanceSpec]:
    """The types of the catalogue files, checked as `manage.py load_catalog` checks one (the first file naming a type
    prices it). Called once Django is set up: the check knows the database's column lengths."""
    from recommender.catalog import read_catalog_file

    specs: dict[str, InstanceSpec] = {}
    for path in paths:
        for row in read_catalog_file(path)["types"]:
            specs.setdefault(row["name"], InstanceSpec(**row))
    return specs


def config_of(record: PerfRecord) -> explore.Config:
    ps = record.ps_type or ""
    strategy = record.strategy or ("ps" if ps else "mirrored")
    return explore.Config(record.instance_type or "", ps, record.workers or 1, strategy, record.latency_ms or 0.0)


def problems(records: Sequence[PerfRecord]) -> list[Problem]:
    grouped: dict[str, dict[explore.Config, list[float | None]]] = {}
    for r in records:
        if r.workers is None:  # a bandwidth profile, not a run
            continue
        name = f"{r.workload}@B={r.batch_size}"
        grouped.setdefault(name, {}).setdefault(config_of(r), []).append(r.epoch_time_s)
    return [
        Problem(name, {c: tuple(v) for c, v in runs.items()})
        for name, runs in sorted(grouped.items())
        if sum(any(t for t in v) for v in runs.values()) >= 2  # one working configuration is no search
    ]


def truth(problem: Problem, candidates: Sequence[explore.Candidate], alpha: float, beta: float) -> dict:
    means = {c: float(np.mean([t for t in v if t])) for c, v in problem.runs.items() if any(t for t in v)}
    price = {c.config: c.hourly_price for c in candidates}
    t_ref = min(means.values())
    c_ref = min(t * price[c] for c, t in means.items())
    scores = {c: explore.objective(t, price[c], alpha, beta, t_ref, c_ref) for c, t in means.items()}
    return {"scores": scores, "best": min(scores.values()), "best_config": min(scores, key=lambda c: scores[c])}


def drawer(problem: Problem, rng: np.random.Generator):
    def run(config: explore.Config) -> float | None:
        runs = problem.runs[config]
        return runs[int(rng.integers(len(runs)))]

    return run


def cherrypick(candidates, run, alpha, beta, budget, rng) -> explore.Search:
    """CherryPick-style BO (module docstring): GP (Matérn, fitted), plain EI, three random starts, no transfer."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    x = np.array([c.features for c in candidates])
    span = x.max(axis=0) - x.min(axis=0)
    x = (x - x.min(axis=0)) / np.where(span > 0, span, 1.0)
    order = list(rng.permutation(len(candidates)))
    trials: list[explore.Trial] = []
    reason = "every candidate has been tried"
    while len(trials) < len(candidates):
        tried = {t.config for t in trials}
        current = explore.best_measured(candidates, trials, alpha, beta)
        ok = [(i, math.log(t.epoch_time_s)) for t in trials if t.epoch_time_s for i in
              [next(j for j, c in enumerate(candidates) if c.config == t.config)]]  # fmt: skip
        if len(trials) < CHERRYPICK_STARTS or len(ok) < 2 or current is None:
            i = next(i for i in order if candidates[i].config not in tried)
        else:
            kernel = ConstantKernel() * Matern(nu=2.5) + WhiteKernel(1e-3, (1e-6, 1.0))
            gp = GaussianProcessRegressor(kernel, normalize_y=True, random_state=0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gp.fit(x[[i for i, _ in ok]], [y for _, y in ok])
                mean, sd = gp.predict(x, return_std=True)
            times = np.exp(mean)
            prices = np.array([c.hourly_price for c in candidates])
            t_ref, c_ref = times.min(), (times * prices).min()
            best_f = explore.objective(
                float(np.mean([t.epoch_time_s for t in trials if t.config == current[0].config and t.epoch_time_s])),
                current[0].hourly_price, alpha, beta, t_ref, c_ref,
            )  # fmt: skip
            eis = [
                (explore.expected_improvement(mean[j], sd[j], alpha / t_ref + beta * prices[j] / c_ref, best_f), j)
                for j, c in enumerate(candidates)
                if c.config not in tried
            ]
            ei, i = max(eis)
            if len(trials) >= CHERRYPICK_MIN_TRIALS and ei < CHERRYPICK_EI_SHARE * best_f:
                reason = "expected improvement under 10 % of the best"
                break
        trials.append(explore.Trial(candidates[i].config, run(candidates[i].config)))
    current = explore.best_measured(candidates, trials, alpha, beta)
    spent = sum(explore.trial_cost(c, budget) for t in trials for c in candidates if c.config == t.config)
    return explore.Search(tuple(trials), current[0].config if current else None, reason, spent)


def random_search(candidates, run, alpha, beta, budget, count, rng) -> explore.Search:
    picks = [candidates[i] for i in rng.permutation(len(candidates))[:count]]
    trials = tuple(explore.Trial(c.config, run(c.config)) for c in picks)
    current = explore.best_measured(candidates, trials, alpha, beta)
    spent = sum(explore.trial_cost(c, budget) for c in picks)
    return explore.Search(trials, current[0].config if current else None, f"{count} random trials", spent)


def history_of(records: Sequence[PerfRecord], problem: Problem) -> list[explore.HistoryRecord]:
    """Every other problem's runs (other workloads, and this workload at other batch sizes) as history."""
    return [
        explore.HistoryRecord(f"{r.workload}@B={r.batch_size}", config_of(r), r.epoch_time_s)
        for r in records
        if r.workers is not None and r.epoch_time_s and f"{r.workload}@B={r.batch_size}" != problem.name
    ]


def grid_format(path: Path) -> tuple[str, str | None]:
    """(format, workload) of a grid file: samples.toml's entry for a shipped grid; else csv when its first row names
    the import's columns (a header), anwar2021 (headerless rows) otherwise, filed under the file's name."""
    listed = {p.resolve(): (fmt, workload) for p, fmt, workload, _ in shipped_grids()}
    if path.resolve() in listed:
        fmt, workload = listed[path.resolve()]
        return fmt, workload or (path.stem if fmt == "anwar2021" else None)
    from recommender.perfdata import CSV_COLUMNS, data_lines

    first = next(data_lines(path.read_text(encoding="utf-8-sig")), (0, [""]))[1]
    return ("csv", None) if first[0].lower() in CSV_COLUMNS else ("anwar2021", path.stem)


def run_benchmark(args: argparse.Namespace) -> dict:
    path = Path(args.grid)
    if not path.is_file():
        raise SystemExit(f"error: no grid file {path}")
    setup_django()  # the import's parsers and the catalogue's checks read the models
    fmt, workload = grid_format(path)
    if args.format and args.format != fmt:
        fmt, workload = args.format, path.stem if args.format == "anwar2021" else None
    from recommender.perfdata import PerfDataError

    try:
        records = read_grid(path, fmt, workload)
    except PerfDataError as exc:
        raise SystemExit(f"error: {path} ({fmt}): {exc}") from None
    from recommender.catalog import CatalogError, bundled_catalogs, catalog_path

    try:
        catalog = load_catalog([Path(args.catalog)] if args.catalog else [catalog_path(n) for n in bundled_catalogs()])
    except CatalogError as exc:
        raise SystemExit(f"error: {exc}") from None
    budget = explore.Budget(args.budget_dollars, args.budget_minutes, args.window_minutes, args.job_hours)
    searches, unpriced = [], set()
    for problem in problems(records):
        configs = list(problem.runs)
        unpriced |= {n for c in configs for n in (c.instance_type, c.ps_type) if n and n not in catalog}
        unpriced |= {"(none)" for c in configs if not c.instance_type}
        candidates = explore.make_candidates(configs, catalog, args.unpriced)
        exhaustive = sum(explore.trial_cost(c, budget) for c in candidates)
        grid = truth(problem, candidates, args.alpha, args.beta)
        prior = explore.fit_prior(history_of(records, problem), catalog) if args.transfer else explore.Prior()
        for seed in range(args.seeds):
            rng = np.random.default_rng([seed, sum(map(ord, problem.name))])
            run = drawer(problem, rng)
            ours = explore.search(candidates, run, args.alpha, args.beta, budget, prior, width=args.at_once)
            others = {
                "random": random_search(candidates, run, args.alpha, args.beta, budget, len(ours.trials), rng),
                "cherrypick": cherrypick(candidates, run, args.alpha, args.beta, budget, rng),
            }
            minutes = {  # wall-clock: a window a batch
                "explore": ours.spent_minutes,
                "random": math.ceil(len(ours.trials) / args.at_once) * budget.window_minutes,
                "cherrypick": len(others["cherrypick"].trials) * budget.window_minutes,
            }
            for method, s in {"explore": ours, **others}.items():
                regret = grid["scores"][s.chosen] / grid["best"] - 1 if s.chosen in grid["scores"] else None
                searches.append({
                    "method": method, "workload": problem.name, "seed": seed,
                    "trials": [t.config.as_dict() | {"epoch_time_s": t.epoch_time_s} for t in s.trials],
                    "chosen": s.chosen.as_dict() if s.chosen else None,
                    "best": grid["best_config"].as_dict(),
                    "regret": regret, "cost_share": s.spent_dollars / exhaustive, "configurations": len(candidates),
                    "minutes": minutes[method], "reason": s.reason,
                })  # fmt: skip
    return {
        "grid": str(args.grid), "format": fmt, "alpha": args.alpha, "beta": args.beta, "transfer": args.transfer,
        "seeds": args.seeds, "window_minutes": args.window_minutes, "job_hours": args.job_hours,
        "at_once": args.at_once,
        "unpriced_types": sorted(unpriced), "unpriced_price": args.unpriced,
        "searches": searches, "summary": summary(searches),
    }  # fmt: skip


def summary(searches: Sequence[dict]) -> dict:
    out = {}
    for method in ("explore", "random", "cherrypick"):
        rows = [s for s in searches if s["method"] == method]
        if not rows:
            continue
        within = sum(s["regret"] is not None and s["regret"] <= GOAL_WITHIN for s in rows) / len(rows)
        trials = statistics.median(len(s["trials"]) for s in rows)
        cost = statistics.median(s["cost_share"] for s in rows)
        regrets = [s["regret"] for s in rows if s["regret"] is not None]
        out[method] = {
            "searches": len(rows), "within_5pct": within, "median_trials": trials, "median_cost_share": cost,
            "mean_cost_share": statistics.fmean(s["cost_share"] for s in rows),
            "median_minutes": statistics.median(s["minutes"] for s in rows),
            "median_regret": statistics.median(regrets) if regrets else None,
            "max_regret": max(regrets) if regrets else None,
            "goal_met": within >= GOAL_SHARE and trials <= GOAL_TRIALS and cost < GOAL_COST,
        }  # fmt: skip
    return out


def _config(c: dict | None) -> str:
    if c is None:
        return "none"
    ps = f"+ps:{c['ps_type']}" if c["ps_type"] else ""
    return f"{c['workers']}×{c['instance_type'] or '?'}{ps}/{c['strategy']}@{c['latency_ms']:g}ms"


def print_text(result: dict) -> None:
    print(f"grid {result['grid']}  α={result['alpha']:g} β={result['beta']:g}  transfer={result['transfer']}  "
          f"window {result['window_minutes']:g} min, job {result['job_hours']:g} h, "
          f"{result['at_once']} at once")  # fmt: skip
    if result["unpriced_types"]:
        print(f"unpriced types (${result['unpriced_price']:g}/h a node): {', '.join(result['unpriced_types'])}")
    for s in result["searches"]:
        regret = "failed" if s["regret"] is None else f"{s['regret']:+.1%}"
        print(f"{s['workload']} seed {s['seed']} {s['method']:<10} {len(s['trials'])}/{s['configurations']} trials "
              f"[{', '.join(_config(t) for t in s['trials'])}] → {_config(s['chosen'])} regret {regret} "
              f"cost {s['cost_share']:.1%} {s['minutes']:g} min ({s['reason']})")  # fmt: skip
    print("summary (goal: ≥ 90 % within 5 %, median ≤ 4 trials, cost < 10 %):")
    for method, m in result["summary"].items():
        print(f"  {method:<10} within 5 %: {m['within_5pct']:.0%}  median trials {m['median_trials']:g}  "
              f"median cost {m['median_cost_share']:.1%} (mean {m['mean_cost_share']:.1%})  "
              f"median {m['median_minutes']:g} min  "
              f"median regret {m['median_regret']:.1%} max {m['max_regret']:.1%}  "
              f"goal {'met' if m['goal_met'] else 'NOT met'}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", required=True, help="a grid of runs in import_perf_data's csv format")
    parser.add_argument("--format", choices=("csv", "anwar2021"), help="the grid's import format (default: detected)")
    parser.add_argument("--catalog", help="price types from this catalogue JSON only (default: every bundled one)")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--alpha", type=float)
    parser.add_argument("--beta", type=float)
    parser.add_argument("--preset", choices=sorted(explore.PRESETS), default="balanced")
    parser.add_argument("--transfer", action="store_true", help="the file's other workloads' records as history")
    parser.add_argument("--window-minutes", type=float, default=10.0, help="one trial's length")
    parser.add_argument("--job-hours", type=float, default=10.0, help="the job's length, what a better pick saves")
    parser.add_argument("--budget-dollars", type=float, default=math.inf)
    parser.add_argument("--budget-minutes", type=float, default=math.inf)
    parser.add_argument("--unpriced", type=float, default=1.0, help="$/h a node of a type no catalogue prices")
    parser.add_argument("--at-once", type=int, default=1, help="explore's trials that may run at the same time")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    args = parser.parse_args(argv)
    if (args.alpha is None) != (args.beta is None):
        parser.error("give --alpha and --beta together")
    if args.at_once < 1:
        parser.error("--at-once must be at least 1")
    if args.alpha is None:
        args.alpha, args.beta = explore.PRESETS[args.preset]
    result = run_benchmark(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_text(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
