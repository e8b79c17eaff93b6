"""explore's trial runs (issue 44): short runs of the job's own code — its bundle, dataset and parameters — on the
clusters explore's search chooses (recommender/explore.py, asked through planning.plan), each measured, kept as a
record of the workload (source: trial) and torn down, until the search stops and the job runs on the cluster chosen.

A trial is a short run as Scala-Opt's profiling run is (fc2/services/profiling.py, whose mechanics it shares): a
cluster on the job's provider, named and recorded on the job before anything is made (Job.cluster, so that a cancel,
the job's release or the sweep tears it down), an entry of Job.profiling_runs with `"kind": "trial"` (so that its cost
is the job's, counted in its whole-job budget and on the dashboard like a profiling run's), torn down whatever happens.
Its nodes are told to train for FC2_EXPLORE_TRIAL_S (FC2_TRAIN_SECONDS, the bundle contract: whole epochs until that
many seconds have passed) and to report to nobody; the chief's command is watched until it ends, and its epoch time
is read from the result it kept on its node (its metrics.json: the steady state's `epoch_time_s`, start-up apart,
monitor.figures.epoch_time_s), checked against its physical bound as every figure the job's own code writes is
(recommender/bounds.py).

A trial that measures nothing — the code failed, a node was lost, the code did not end within its window and a grace,
no epoch time in its metrics — is kept all the same, as a record with no time and its entry's `error` saying why:
the search sees it and does not try that cluster again; its nodes' logs are kept among the job's results
(`logs/trial-<n>/<node>.log`). A search that finds no measured cluster to run on (every trial failed) fails the job,
listing each trial and why. A failure that is not the cluster's — the job cancelled or failed by a limit meanwhile,
a transient one of the provider's (its step is tried again, and the search goes on from the trials recorded) —
records nothing. Trials run one after the other (none overlap).

Once the search stops, what it did is kept on the job (Job.search): the cluster believed best before the trials and
the one chosen after, each with its predicted epoch time and interval, why it stopped, the trials made and their cost.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict
from datetime import datetime
from typing import NoReturn

from django.conf import settings
from django.utils import timezone

import provisioner
from common.numbers import significant, usd, usd_per_hour
from fc2 import jsonbounds
from fc2.models import Job, batch_size_parameter
from fc2.services import artifacts, noderecords, planning, profiling
from fc2.services.requests import JobRequest
from monitor.figures import epoch_time_s
from provisioner import ClusterInfo, NodeResult, ProvisionError, RunSpec
from provisioner.types import is_chief
from recommender import service
from recommender.bounds import out_of_bounds
from recommender.models import PerformanceRecord
from recommender.types import RecommendationError, SearchEstimate, TrialConfig

logger = logging.getLogger(__name__)
KIND = "trial"  # an entry of Job.profiling_runs that is a trial run
POLL_S = 3.0  # how often the trial's nodes are asked whether its code still runs
# Past its window, how long a trial's code may take to end: it trains whole epochs until the window has passed, and
# starts (imports, data, tracing) before; an epoch as long as the window doubles it.
MIN_GRACE_S = 60
LOG_CHARS = 300  # of a failed node's last log line, in the trial's error


class TrialFailed(Exception):
    """The trial ran and measured nothing; the message says why, in the user's words."""


def entries(job: Job) -> list[dict]:
    """The job's trial runs (Job.profiling_runs of kind "trial"), in the order they were made."""
    return [run for run in job.profiling_runs or [] if isinstance(run, dict) and run.get("kind") == KIND]


def spent(job: Job, now: datetime | None = None) -> tuple[float, float]:
    """$ and minutes the job's trials have taken so far (one under way, up to `now`): what its search has spent of its
    budget. Each is billed from its record on the job to its teardown, at its $/h, as the job's cost counts it."""
    now = now or timezone.now()
    dollars = minutes = 0.0
    for run in entries(job):
        up_from, up_to, hourly = job.run_span(run, now)
        seconds = max(0.0, (up_to - up_from).total_seconds())
        dollars += hourly * seconds / 3600
        minutes += seconds / 60
    return dollars, minutes


def describe(trial: dict) -> str:
    """A trial's cluster (its entry, or a TrialConfig as a dict) in words: "2 × lab-w-250 with a lab-ps-450 PS" or
    "3 × lab-w-1g, all-reduce"."""
    ps = f" with a {trial.get('ps_type')} PS" if trial.get("strategy") == Job.Strategy.PS else ", all-reduce"
    return f"{trial.get('workers')} × {trial.get('worker_type')}{ps}"


def search(job: Job, request: JobRequest, first: planning.Plan, run: RunSpec) -> planning.Plan:
    """Run the trials explore's search asks for, one at a time, planning again after each with what this job's
    trials have spent, until the plan needs no more (`first`: the plan before them); keep the search on the job and
    return the final plan: a cluster this workload's records measured (this job's trials, or earlier runs).
    RecommendationError, listing this job's trials and what became of each, when the planner finds none (every trial
    failed) or the search asks again for a cluster whose trial is recorded (never run twice)."""
    chosen = first
    while chosen.search is not None:
        trial = chosen.search.next
        if _key(asdict(trial)) in {_key(run) for run in entries(job) if run.get("record")}:
            again = f"explore's search asked again for {describe(asdict(trial))}, whose trial is recorded"
            raise RecommendationError(_nothing_ran(job, again))
        job.log(f"explore: {chosen.search.text or chosen.search.reason}")
        run_trial(job, trial, run)
        try:
            chosen = planning.plan(request, job.owner_id, trials_spent=spent(job))
        except RecommendationError as refused:
            raise RecommendationError(_nothing_ran(job, str(refused))) from refused
    keep_search(job, request, first.search, chosen)
    return chosen


def run_trial(job: Job, trial: TrialConfig, run: RunSpec) -> PerformanceRecord:
    """One trial of the job's code (`run`) on `trial`'s cluster: made, trained for FC2_EXPLORE_TRIAL_S, measured, torn
    down; its record (its epoch time, or None with the entry's error saying why). A job that ended meanwhile
    (profiling.JobEnded) and a transient failure to make the cluster (its step is tried again) raise, recording
    nothing."""
    profiling.still_recommending(job, "search")  # cancelled between two trials: nothing more is made
    number = len(entries(job)) + 1
    spec = profiling.cluster_spec(job, trial.strategy, trial.workers, trial.worker_type, trial.ps_type)
    hourly = service.cluster_price(job.catalog, trial.workers, trial.worker_type, trial.ps_type)
    window = settings.FC2_EXPLORE_TRIAL_S
    entry = {
        "kind": KIND,
        "number": number,
        "worker_type": trial.worker_type,
        "ps_type": trial.ps_type,
        "workers": trial.workers,
        "strategy": trial.strategy,
        "batch_size": batch_size_parameter(job.parameters or {}),
        "cluster": spec.cluster_id,
        "hourly_cost": float(hourly),
        "epoch_time_s": None,
        "error": "",
        "record": None,
    }
    job.log(f"trial run {number}: {describe(entry)}, {window} s of training at {usd_per_hour(hourly)}")
    epoch: float | None = None
    try:
        with profiling.short_run(job, entry, spec, run, window) as cluster:
            try:
                epoch = _epoch_time(*_watch(job, cluster))
            except TrialFailed:
                _keep_logs(job, number, cluster)
                raise
    except TrialFailed as failed:
        entry["error"] = str(failed)
    except ProvisionError as error:
        if isinstance(error, profiling.JobEnded) or error.transient:
            _stop(job, entry, error)
        entry["error"] = f"its cluster could not be made or started: {error}"
    except Exception as error:
        _stop(job, entry, error)
    record = profiling.keep_record(
        job,
        workload=job.workload,
        instance_type=trial.worker_type,
        ps_type=trial.ps_type,
        workers=trial.workers,
        batch_size=entry["batch_size"],
        strategy=trial.strategy,
        epoch_time_s=epoch,
        source=PerformanceRecord.Source.TRIAL,
        origin=f"trial run {number} of job {job.pk} on {job.provider}",
    )
    entry.update(epoch_time_s=epoch, record=record.pk)
    profiling.keep_entry(job, entry)
    job.log(
        f"trial run {number}: epoch time {significant(epoch)} s"
        if epoch is not None
        else f"trial run {number} measured nothing: {entry['error']}"
    )
    return record


def _stop(job: Job, entry: dict, error: Exception) -> NoReturn:
    """A trial that ends the search step (the job ended, a transient failure its step is tried again for, a fault of
    the platform's): its entry says why, nothing is recorded of the cluster."""
    entry["error"] = str(error) or type(error).__name__
    profiling.keep_entry(job, entry)
    raise error


def _keep_logs(job: Job, number: int, cluster: ClusterInfo) -> None:
    """A failed trial's node logs, kept among the job's results (`logs/trial-<n>/<node>.log`) before its cluster
    goes; what cannot be fetched is only logged (the trial's error says what failed all the same)."""
    try:
        for name, log in provisioner.fetch_logs(cluster).items():
            artifacts.store_artifact(job, f"logs/trial-{number}/{name}.log", log.encode())
    except (ProvisionError, OSError):
        logger.warning("job %s: the logs of trial run %s could not be kept", job.pk, number, exc_info=True)


def _watch(job: Job, cluster: ClusterInfo) -> tuple[str, NodeResult]:
    """The chief's name and the result it kept once its command ended. TrialFailed when another node's code failed
    first, a node cannot be reached for FC2_NODE_UNREACHABLE_S, or the code has not ended within the window and its
    grace; profiling.JobEnded once the job is no longer recommending (cancelled, failed by a limit)."""
    chief = next(node.name for node in cluster.nodes if is_chief(cluster.strategy, node.role, node.index))
    window = settings.FC2_EXPLORE_TRIAL_S
    grace = max(MIN_GRACE_S, window)
    deadline = time.monotonic() + window + grace
    unreachable: dict[str, float] = {}  # node → since when it has not answered
    while True:
        profiling.still_recommending(job, "trial run")
        alive = provisioner.alive(cluster)
        now = time.monotonic()
        for name, up in alive.items():
            if up is not None:
                unreachable.pop(name, None)
            elif now - unreachable.setdefault(name, now) >= settings.FC2_NODE_UNREACHABLE_S:
                raise TrialFailed(
                    f"{name} was lost: its machine did not answer for {settings.FC2_NODE_UNREACHABLE_S} s"
                )
        if ended := [name for name, up in alive.items() if up is False]:
            results = provisioner.fetch_results(cluster)
            if chief in ended:
                if chief not in results:
                    raise TrialFailed(f"{chief}'s code ended and left no result (its agent was killed)")
                return chief, results[chief]
            # A node whose code ended before the chief's is no failure unless it failed (a mirrored worker ends just
            # before worker 0).
            for name in ended:
                if name in results and results[name].report.get("status") != "succeeded":
                    raise TrialFailed(_failed(name, results[name]))
        if now >= deadline:
            raise TrialFailed(
                f"its code did not end within {window + grace} s of its start ({window} s of training asked by "
                f"FC2_TRAIN_SECONDS, and {grace} s more for its start and its last epoch): make it honour "
                "FC2_TRAIN_SECONDS (examples/README.md), or give it shorter epochs"
            )
        time.sleep(POLL_S)


def _failed(node: str, result: NodeResult) -> str:
    """Why a node's code failed, with the last line of its log (a traceback's error)."""
    report = result.report
    lines = jsonbounds.clean_text(str(report.get("log_tail") or "")).strip().splitlines()
    last = lines[-1].strip()[-LOG_CHARS:] if lines else ""
    return f"{node}'s code failed (exit {report.get('exit_code')})" + (f": {last}" if last else "")


def _epoch_time(chief: str, result: NodeResult) -> float:
    """The steady-state epoch time the chief's kept metrics.json says, within its bound; TrialFailed otherwise."""
    if result.report.get("status") != "succeeded":
        raise TrialFailed(_failed(chief, result))
    data = result.outputs.get("metrics.json")
    if data is None:
        raise TrialFailed(f"{chief} wrote no metrics.json, so no epoch time (examples/README.md)")
    metrics, _ = noderecords.job_metrics(data)  # the job's own JSON: cleaned and bounded as the job's would be
    try:
        epoch = epoch_time_s(metrics)
    except (ArithmeticError, TypeError, ValueError):  # (an integer too large for a float)
        epoch = math.inf
    if epoch is None:
        raise TrialFailed("its metrics.json gives no epoch time (epoch_time_s, or duration_s and epochs)")
    if problems := out_of_bounds({"epoch_time_s": epoch}):
        raise TrialFailed(f"its metrics.json's {'; '.join(problems)}")
    return epoch


def _key(trial: dict) -> tuple:
    """What makes two trials (entries, or TrialConfigs as dicts) the same cluster."""
    return (trial.get("worker_type"), trial.get("ps_type") or "", trial.get("workers"), trial.get("strategy"))


def _nothing_ran(job: Job, why: str) -> str:
    """Why the search found no cluster that runs the code — `why`, a sentence — then each trial and what became of
    it."""
    made = entries(job)
    listed = "; ".join(f"trial {run.get('number')} ({describe(run)}): {_outcome(run)}" for run in made)
    return why + (f". Its {len(made)} trial{'s' if len(made) != 1 else ''}: {listed}" if made else "")


def _outcome(run: dict) -> str:
    """What a trial measured, or why it measured nothing."""
    if run.get("epoch_time_s"):
        return f"epoch time {significant(run['epoch_time_s'])} s"
    return run.get("error") or "no result"


def keep_search(
    job: Job, request: JobRequest, before: SearchEstimate | None, after: planning.Plan, now: datetime | None = None
) -> dict:
    """Keep what the search did on the job (Job.search): `before`, the estimate before its first trial (None when the
    workload needed none), and `after`, the plan it chose."""
    extra = ((after.recommendation or {}).get("extra") or {}).get("search") or {}
    interval = extra.get("interval_s") or [None, None]
    made = entries(job)
    dollars, _ = spent(job, now)
    dollars_asked, minutes = request.search_limits
    budget = float(dollars_asked)
    kept = {
        "before": _config(before.predicted_config, before.predicted)
        if before is not None and before.predicted_config is not None
        else None,
        "after": {
            "worker_type": after.worker_type,
            "ps_type": after.ps_type,
            "workers": after.workers,
            "strategy": after.strategy,
            "hourly_cost": None if after.hourly_cost is None else float(after.hourly_cost),
            "epoch_time_s": after.predicted_epoch_time_s,
            "low_s": interval[0],
            "high_s": interval[-1],
        },
        "reason": str(extra.get("reason") or ("no trial needed" if not made else "")),
        "trials": len(made),
        "spent_dollars": round(dollars, 4),
        "budget_dollars": budget,
        "budget_minutes": minutes,
        "no_trial_needed": before is None and not made,
    }
    Job.objects.filter(pk=job.pk).update(search=kept)
    job.search = kept
    job.log(
        f"explore: {kept['reason'] or 'search done'} — {len(made)} trial{'s' if len(made) != 1 else ''}, "
        f"{usd(dollars)} of its {usd(budget)}"
    )
    return kept


def _config(trial: TrialConfig, predicted: tuple[float, float, float] | None) -> dict:
    """A configuration as Job.search keeps it, with its predicted epoch time and interval (s)."""
    time_s, low, high = predicted or (None, None, None)
    return {
        "worker_type": trial.worker_type,
        "ps_type": trial.ps_type,
        "workers": trial.workers,
        "strategy": trial.strategy,
        "hourly_cost": trial.hourly_cost,
        "epoch_time_s": time_s,
        "low_s": low,
        "high_s": high,
    }
