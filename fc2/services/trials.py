"""explore's trial runs (issue 44): short runs of the job's own code — its bundle, dataset and parameters — on the
clusters explore's search chooses (recommender/explore.py, asked through planning.plan), each measured, kept as a
record of the workload (source: trial) and torn down, until the search stops and the job runs on the cluster chosen.

A trial is a short run as Scala-Opt's profiling run is (fc2/services/profiling.py, whose mechanics it shares): a
cluster on the job's provider, named and recorded on the job before anything is made (an entry of Job.profiling_runs
with `"kind": "trial"`, and Job.cluster while it is up), so that a cancel, the job's release or the sweep tears it
down, and so that its cost is the job's, counted in its whole-job budget and on the dashboard like a profiling run's;
torn down whatever happens. Its nodes are told to train for FC2_EXPLORE_TRIAL_S (FC2_TRAIN_SECONDS, the bundle
contract: whole epochs until that many seconds have passed) and to report to nobody; the chief's command is watched
until it ends, and its epoch time is read from the result it kept on its node (its metrics.json: the steady state's
`epoch_time_s`, start-up apart, monitor.figures.epoch_time_s), checked against its physical bound as every figure the
job's own code writes is (recommender/bounds.py).

Trials overlap in time where the provider's nodes are machines of their own (aws; planning.trials_at_once): the
search's estimate names a batch (`SearchEstimate.batch`), whose trials run at the same time, each in a thread of its
own, every one's cluster recorded before any is made; the search plans again once all have ended. Their $ add up;
their minutes are wall-clock (`spent`). On the lab and local, whose nodes share this machine's CPUs, one at a time.

A trial that measures nothing — the code failed, a node was lost, the code did not end within its window and a grace,
no epoch time in its metrics — is kept all the same, as a record with no time and its entry's `error` saying why:
the search sees it and does not try that cluster again; its nodes' logs are kept among the job's results
(`logs/trial-<n>/<node>.log`). A search that finds no measured cluster to run on (every trial failed) fails the job,
listing each trial and why. A failure that is not the cluster's — the job cancelled or failed by a limit meanwhile,
a transient one of the provider's (its step is tried again, and the search goes on from the trials recorded) —
records nothing. Nor does a cloud with no capacity for a trial's type in any zone: the type is left out of the rest of
the search (`blocked`), which the timeline says.

Once the search stops, what it did is kept on the job (Job.search): the cluster believed best before the trials and
the one chosen after, each with its predicted epoch time and interval, why it stopped, the trials made and their cost.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import asdict
from datetime import datetime
from typing import NoReturn

from django.conf import settings
from django.db import connection
from django.utils import timezone

import provisioner
from common.numbers import significant, usd, usd_per_hour
from fc2 import jsonbounds
from fc2.models import Job, batch_size_parameter
from fc2.services import artifacts, noderecords, planning, profiling
from fc2.services.requests import JobRequest
from monitor.figures import epoch_time_s
from provisioner import CapacityError, ClusterInfo, ClusterSpec, NodeResult, ProvisionError, RunSpec
from provisioner.types import is_chief
from recommender import service
from recommender.bounds import out_of_bounds
from recommender.models import PerformanceRecord
from recommender.types import RecommendationError, SearchEstimate, TrialConfig

logger = logging.getLogger(__name__)
KIND = "trial"  # an entry of Job.profiling_runs that is a trial run
POLL_S = 3.0  # how often the trial's nodes are asked whether its code still runs
LOG_CHARS = 300  # of a failed node's last log line, in the trial's error


class TrialFailed(Exception):
    """The trial ran and measured nothing; the message says why, in the user's words."""


def entries(job: Job) -> list[dict]:
    """The job's trial runs (Job.profiling_runs of kind "trial"), in the order they were made."""
    return [run for run in job.profiling_runs or [] if isinstance(run, dict) and run.get("kind") == KIND]


def spent(job: Job, now: datetime | None = None) -> planning.Spent:
    """$, minutes and trials the job's trials have taken so far (those under way up to `now`): what its search has
    spent of its budget. Each is billed from its record on the job to its teardown, at its $/h, as the job's cost
    counts it: the $ are their sum; the minutes are wall-clock — trials that overlap in time take their window once."""
    now = now or timezone.now()
    dollars = 0.0
    spans = []
    for run in entries(job):
        up_from, up_to, hourly = job.run_span(run, now)
        dollars += hourly * max(0.0, (up_to - up_from).total_seconds()) / 3600
        spans.append((up_from, max(up_from, up_to)))
    seconds = 0.0
    reached: datetime | None = None  # the end of the union of the spans so far, in order of their start
    for up_from, up_to in sorted(spans):
        if reached is None or up_from > reached:
            seconds += (up_to - up_from).total_seconds()
            reached = up_to
        elif up_to > reached:
            seconds += (up_to - reached).total_seconds()
            reached = up_to
    return planning.Spent(dollars, seconds / 60, len(spans))


def describe(trial: dict) -> str:
    """A trial's cluster (its entry, or a TrialConfig as a dict) in words: "2 × lab-w-250 with a lab-ps-450 PS" or
    "3 × lab-w-1g, all-reduce"."""
    ps = f" with a {trial.get('ps_type')} PS" if trial.get("strategy") == Job.Strategy.PS else ", all-reduce"
    return f"{trial.get('workers')} × {trial.get('worker_type')}{ps}"


def blocked(job: Job) -> set[str]:
    """The instance types a cloud had no capacity for, in any zone, during this job's trials: left out of the rest of
    its search, as the capacity failover leaves them out of a job's relaunch (planning.plan's `blocked`)."""
    return {str(run["no_capacity"]) for run in entries(job) if run.get("no_capacity")}


def search(job: Job, request: JobRequest, first: planning.Plan, run: RunSpec) -> planning.Plan:
    """Run the trials explore's search asks for — each batch of them at the same time (`run_batch`) — planning again
    after each batch with what this job's trials have spent and without the types a cloud had no capacity for, until
    the plan needs no more (`first`: the plan before them); keep the search on the job and return the final plan: a
    cluster this workload's records measured (this job's trials, or earlier runs). RecommendationError, listing this
    job's trials and what became of each, when the planner finds none (every trial failed) or the search asks again
    for a cluster whose trial is recorded (never run twice) or that has a type with no capacity."""
    chosen = first if not blocked(job) else _plan_again(job, request)
    while chosen.search is not None:
        batch = tuple({_key(asdict(trial)): trial for trial in chosen.search.batch}.values())
        recorded = {_key(run) for run in entries(job) if run.get("record")}
        if again := next((trial for trial in batch if _key(asdict(trial)) in recorded), None):
            why = f"explore's search asked again for {describe(asdict(again))}, whose trial is recorded"
            raise RecommendationError(_nothing_ran(job, why))
        full = blocked(job)
        if out := next((trial for trial in batch if {trial.worker_type, trial.ps_type} & full), None):
            no_room = ", ".join(sorted(full))
            why = f"explore's search asked for {describe(asdict(out))}, and the cloud has no capacity for {no_room}"
            raise RecommendationError(_nothing_ran(job, why))
        at_once = f" ({len(batch)} trials at once)" if len(batch) > 1 else ""
        job.log(f"explore: {chosen.search.text or chosen.search.reason}{at_once}")
        run_batch(job, batch, run)
        chosen = _plan_again(job, request)
    keep_search(job, request, first.search, chosen)
    return chosen


def _plan_again(job: Job, request: JobRequest) -> planning.Plan:
    """The plan with what this job's trials have spent and taught, without the types that had no capacity."""
    try:
        return planning.plan(request, job.owner_id, sorted(blocked(job)), trials_spent=spent(job))
    except RecommendationError as refused:
        raise RecommendationError(_nothing_ran(job, str(refused))) from refused


def run_batch(job: Job, batch: tuple[TrialConfig, ...], run: RunSpec) -> None:
    """Run the trials of `batch` at the same time, each in a thread of its own (which closes its database connection
    when it ends), every one's cluster recorded on the job before any is made; return once all have ended. The first
    error that ends the step (the job ended, a transient failure of the provider's, a fault of the platform's) is
    raised then, every trial torn down."""
    profiling.still_recommending(job, "search")  # cancelled between two batches: nothing more is made
    first = len(entries(job)) + 1
    prepared = [_prepare(job, trial, number) for number, trial in enumerate(batch, start=first)]
    for entry, spec in prepared:  # whatever happens to this process, a cancel, the release or the sweep finds each
        profiling.record_run(job, entry, spec)
    if len(prepared) == 1:
        run_trial(job, *prepared[0], run)
        return
    errors: list[BaseException] = []

    def one(entry: dict, spec: ClusterSpec) -> None:
        try:
            run_trial(Job.objects.get(pk=job.pk), entry, spec, run)
        except BaseException as error:  # raised in the caller's thread, once every trial has ended
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=pair, name=f"trial-{pair[0]['number']}") for pair in prepared]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    job.refresh_from_db(fields=["profiling_runs", "cluster"])
    if errors:
        raise errors[0]


def _prepare(job: Job, trial: TrialConfig, number: int) -> tuple[dict, ClusterSpec]:
    """Trial run `number`'s entry on the job (Job.profiling_runs) and its cluster."""
    spec = profiling.cluster_spec(job, trial.strategy, trial.workers, trial.worker_type, trial.ps_type)
    hourly = service.cluster_price(job.catalog, trial.workers, trial.worker_type, trial.ps_type)
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
    return entry, spec


def run_trial(job: Job, entry: dict, spec: ClusterSpec, run: RunSpec) -> PerformanceRecord | None:
    """One trial of the job's code (`run`) on its cluster (`spec`; `entry`, its entry on the job): made, trained for
    FC2_EXPLORE_TRIAL_S, measured, torn down; its record (its epoch time, or None with the entry's error saying why).
    A cloud with no capacity for one of its types in any zone records nothing: the entry names the type (`blocked`),
    and None is returned. A job that ended meanwhile (profiling.JobEnded) and a transient failure to make the cluster
    (its step is tried again) raise, recording nothing."""
    number = entry["number"]
    window = settings.FC2_EXPLORE_TRIAL_S
    job.log(f"trial run {number}: {describe(entry)}, {window} s of training at {usd_per_hour(entry['hourly_cost'])}")
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
    except CapacityError as error:  # not the configuration's failure, nor a reason to do the step again
        entry.update(error=str(error), no_capacity=error.instance_type)
        profiling.keep_entry(job, entry)
        job.log(f"trial run {number} did not start: {error}; the search goes on without {error.instance_type}")
        return None
    except ProvisionError as error:
        if isinstance(error, profiling.JobEnded) or error.transient:
            _stop(job, entry, error)
        entry["error"] = f"its cluster could not be made or started: {error}"
    except Exception as error:
        _stop(job, entry, error)
    record = profiling.keep_record(
        job,
        workload=job.workload,
        instance_type=entry["worker_type"],
        ps_type=entry["ps_type"],
        workers=entry["workers"],
        batch_size=entry["batch_size"],
        strategy=entry["strategy"],
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
    # Past its window, how long a trial's code may take to end: it starts (FC2_RUN_START_S) and trains whole epochs
    # until the window has passed; an epoch as long as the window doubles it.
    grace = max(settings.FC2_RUN_START_S, window)
    deadline = time.monotonic() + window + grace
    lost = profiling.LostNodes()
    while True:
        profiling.still_recommending(job, "trial run")
        alive = provisioner.alive(cluster)
        if name := lost.lost(alive):
            raise TrialFailed(f"{name} was lost: {lost.said()}")
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
        if time.monotonic() >= deadline:
            raise TrialFailed(
                f"its code did not end within {window + grace} s of its start ({window} s of training asked by "
                f"FC2_TRAIN_SECONDS, and {grace} s more for its start, FC2_RUN_START_S, and its last epoch): make it "
                "honour FC2_TRAIN_SECONDS (examples/README.md), or give it shorter epochs"
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
    dollars = spent(job, now).dollars
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
