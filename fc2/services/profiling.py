"""Scala-Opt's profiling run (FC² §5.2.4, §6): the bandwidth b_t one worker of type t uses for a workload, measured on
the smallest cluster there is — 1 PS + 1 worker — for a short, bounded time, and kept as a performance record
(source: profiled) that this job and every later job of the workload reuse.

It runs the user's own code (the job's bundle, dataset and parameters) on the job's provider, as a cluster of the
job's (named `fc2-<job>-<hex>` and recorded on the job before anything is made, so that a lost worker's sweep or the
job's release tears it down like any of its clusters). Its agents report to nobody: each keeps its samples on its
node (provisioner.kept_samples), and the worker's are read every few seconds until it has communicated for
FC2_PROFILE_BUSY_S, its training has ended, or FC2_PROFILE_S has passed since its start (and FC2_RUN_START_S more, for
its code's imports and data: its window is of training). b_t is the worker's mean bandwidth as the job page defines it
(monitor/figures.py: the busier direction, over the seconds it communicated).
The run's time and $/h are kept on the job (Job.profiling_runs): its cost is part of the job's; so are its place among
the job's runs and when its window closes, which the job page shows while it runs (`progress`).

How long the job's code trains is the job's parameters' business (its epochs), and a job of a few seconds would leave
nothing to measure: the run's nodes are told to train for the run's whole window whatever their epochs say
(FC2_TRAIN_SECONDS = FC2_PROFILE_S, part of the bundle contract, examples/README.md), and the run is torn down once
measured. Code that does not honour it and ends too soon fails the job with what to change.

Only where a node's network is its own (lab namespaces, EC2 instances: Provider.own_network) can one worker's
traffic be told apart; elsewhere the job fails with the reason rather than store a wrong figure.

What it shares with explore's trial runs (fc2/services/trials.py) is written here once: a short run's cluster named
for the job (`cluster_spec`), launched, bootstrapped with FC2_TRAIN_SECONDS and torn down whatever happens, recorded
on the job before anything is made (`record_run`, `short_run`), its entry merged under the job's row lock so that runs
at once (explore's overlapping trials) never lose each other's (`keep_entry`), the check that the job still wants it
(`still_recommending`), what it measured kept as the owner's record linked to the job (`keep_record`), and the
teardown of every run a lost step or an ended job left under way (`tear_down_stale`).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

import provisioner
from common.numbers import usd_per_hour
from fc2.models import Job, JobRecord
from monitor.figures import MIN_BUSY_S, node_figures
from monitor.series import Sample
from provisioner import ClusterInfo, ClusterSpec, ProvisionError, RunSpec, TransientProvisionError
from recommender import service
from recommender.bounds import out_of_bounds
from recommender.models import PerformanceRecord
from recommender.types import MissingProfile

logger = logging.getLogger(__name__)
POLL_S = 3.0  # how often the worker's kept samples are read
WORKER = "worker-0"  # the profiled node: the one worker of a 1 PS + 1 worker cluster (provisioner.types.node_layout)
CHIEF = "chief-0"  # the node whose code drives the training and ends with it


def measure(job: Job, missing: Sequence[MissingProfile], run: RunSpec) -> list[PerformanceRecord]:
    """Run a profiling run for each missing profile, one after the other; their records. `run` is what the job's
    nodes would run (its report URL and token are not used: the profiling run reports to nobody)."""
    if reason := cannot_profile(job.provider, missing):
        raise ProvisionError(reason)
    return [_profile(job, profile, run, (number, len(missing))) for number, profile in enumerate(missing, start=1)]


@dataclass(frozen=True)
class Progress:
    """Where a job's profiling is, as its page says it: "profiling 2 of 3", and how long the run may still take."""

    number: int  # the run under way, from 1
    runs: int  # how many this recommend step makes
    worker_type: str  # the type whose bandwidth it measures
    seconds_left: float | None  # until its window (FC2_PROFILE_S of training) closes; None while its cluster starts


def progress(job: Job, now: datetime | None = None) -> Progress | None:
    """The profiling run under way for the job, None when there is none (not recommending, between runs, or a trial
    run of explore's under way: fc2/services/trials.py)."""
    if job.state != Job.State.RECOMMENDING:
        return None
    under_way = [
        run
        for run in job.profiling_runs or []
        if isinstance(run, dict) and not run.get("ended_at") and run.get("kind") != "trial"
    ]
    if not under_way:
        return None
    run = under_way[-1]
    number, runs = run.get("number") or len(job.profiling_runs), run.get("runs") or len(job.profiling_runs)
    seconds_left = None
    if window_ends_at := run.get("window_ends_at"):
        now = now or timezone.now()
        seconds_left = max(0.0, (datetime.fromisoformat(window_ends_at) - now).total_seconds())
    return Progress(number, runs, str(run.get("worker_type", "")), seconds_left)


def cannot_profile(provider: str, missing: Sequence[MissingProfile]) -> str | None:
    """Why the provider cannot measure these profiles (None: it can)."""
    entry = provisioner.get(provider)
    if entry.own_network:
        return None
    return (
        f"Scala-Opt needs the bandwidth one worker uses ({'; '.join(map(str, missing))}) and nothing has measured it; "
        f"{entry.label}'s nodes share the machine's network, so one worker's traffic cannot be told apart there: run "
        "this workload once on the lab or AWS (its profile is kept for every later job), or import a record with "
        "bandwidth_mbps"
    )


def plan_text(missing: Sequence[MissingProfile]) -> str:
    """What a job lacking these profiles will do first, as its plan says it."""
    return (
        f"Scala-Opt first measures the bandwidth one worker uses, on a profiling run of 1 PS + 1 worker for each of "
        f"{'; '.join(map(str, missing))} (at most {settings.FC2_PROFILE_S} s of training each, billed to the job), "
        "then chooses the cluster within your limit; later jobs of this workload reuse what it measured."
    )


def _profile(job: Job, profile: MissingProfile, run: RunSpec, place: tuple[int, int]) -> PerformanceRecord:
    spec = cluster_spec(job, Job.Strategy.PS, 1, profile.worker_type, profile.ps_type)
    hourly = service.cluster_price(job.catalog, 1, profile.worker_type, profile.ps_type)
    number, runs = place
    entry = {
        "number": number,
        "runs": runs,
        "worker_type": profile.worker_type,
        "ps_type": profile.ps_type,
        "batch_size": profile.batch_size,
        "cluster": spec.cluster_id,
        "hourly_cost": float(hourly),
        "bandwidth_mbps": None,
    }
    job.log(
        f"profiling run: 1 {profile.ps_type} PS + 1 {profile.worker_type} worker, to measure the bandwidth one "
        f"worker uses (at most {settings.FC2_PROFILE_S} s of training, at {usd_per_hour(hourly)})"
    )
    with short_run(job, entry, spec, run, settings.FC2_PROFILE_S) as cluster:
        samples, ended_after = _watch(job, cluster)
        figures = node_figures(WORKER, "worker", profile.worker_type, samples)
    if figures.mean_mbps is None or figures.busy_s < MIN_BUSY_S:
        raise ProvisionError(_too_little(profile, figures.busy_s, ended_after))
    entry["bandwidth_mbps"] = round(figures.mean_mbps, 3)
    keep_entry(job, entry)
    job.log(
        f"profiling run: one {profile.worker_type} worker uses {figures.mean_mbps:.1f} Mbps "
        f"(mean over {figures.busy_s:.0f} s of traffic, peak {figures.peak_mbps:.1f} Mbps)"
    )
    measured = {"bandwidth_mbps": round(figures.mean_mbps, 3), "latency_ms": job.latency_ms}
    if problems := out_of_bounds(measured):  # (the bytes its nodes report are the job's to forge)
        raise ProvisionError(f"the profiling run measured no bandwidth a record may hold: {'; '.join(problems)}")
    return keep_record(
        job,
        workload=profile.workload,
        instance_type=profile.worker_type,
        ps_type=profile.ps_type,
        workers=1,
        batch_size=profile.batch_size,
        strategy=Job.Strategy.PS,
        bandwidth_mbps=round(figures.mean_mbps, 3),
        cpu_util=None if figures.idleness is None else round(100 * (1 - figures.idleness), 1),
        source=PerformanceRecord.Source.PROFILED,
        origin=f"profiling run of job {job.pk} on {job.provider}",
    )


# What Scala-Opt's profiling runs and explore's trial runs (fc2/services/trials.py) share: a short run of the job's
# own code on a cluster of its own, recorded on the job (Job.cluster and an entry of Job.profiling_runs) before
# anything is made and torn down whatever happens, and the record of what it measured.


def cluster_spec(job: Job, strategy: str, workers: int, worker_type: str, ps_type: str) -> ClusterSpec:
    """A short run's cluster for the job, on its provider, region and latency, named as the job's own clusters are
    (`fc2-<job>-<hex>`: the sweep's reaper knows it for the job's)."""
    return ClusterSpec(
        cluster_id=f"fc2-{job.pk}-{secrets.token_hex(4)}",
        provider=job.provider,
        strategy=strategy,
        workers=workers,
        ps_type=ps_type,
        worker_type=worker_type,
        region=job.region,
        latency_ms=job.latency_ms,
        job_id=job.pk,
    )


@contextmanager
def short_run(job: Job, entry: dict, spec: ClusterSpec, run: RunSpec, train_s: int) -> Iterator[ClusterInfo]:
    """The short run's cluster, launched and bootstrapped with the job's code told to train for `train_s`
    (FC2_TRAIN_SECONDS) and to report to nobody (its agents keep their samples and results on the nodes). Its
    entry (`entry`, named by its "cluster") is kept on the job with when it started, when its window closes and when
    it ended; it is torn down when the block ends, whatever happens. Runs may overlap (explore's trials at once):
    each keeps its own entry (`keep_entry`)."""
    record_run(job, entry, spec)
    try:
        cluster = provisioner.launch(spec, notify=job.log)
        keep_entry(job, entry, cluster=cluster.to_dict())
        cluster = provisioner.bootstrap(cluster, replace(run, report_url="", token="", train_seconds=train_s))
        entry["window_ends_at"] = (timezone.now() + timedelta(seconds=train_s)).isoformat()
        keep_entry(job, entry, cluster=cluster.to_dict())
        yield cluster
    finally:
        provisioner.teardown(spec.provider, spec.cluster_id, spec.region)
        entry["ended_at"] = timezone.now().isoformat()
        keep_entry(job, entry)


def record_run(job: Job, entry: dict, spec: ClusterSpec) -> None:
    """The run's entry and cluster recorded on the job, its billing from now, before anything is made: whatever
    happens to this process, the cluster is found and torn down (a cancel, the job's release, the sweep)."""
    entry.update(cluster=spec.cluster_id, started_at=timezone.now().isoformat(), window_ends_at=None, ended_at=None)
    empty = ClusterInfo(spec.cluster_id, spec.provider, spec.strategy, nodes=(), region=spec.region)
    keep_entry(job, entry, cluster=empty.to_dict())


class JobEnded(ProvisionError):
    """The job ended (cancelled, or failed by a limit) while a short run of its recommend step ran."""


def still_recommending(job: Job, what: str) -> None:
    """JobEnded unless the job is still recommending: cancelled, or failed by a limit, it makes no more `what`."""
    if Job.objects.filter(pk=job.pk).values_list("state", flat=True).get() != Job.State.RECOMMENDING:
        raise JobEnded(f"the job ended while its {what} ran")


def keep_record(job: Job, **fields: Any) -> PerformanceRecord:
    """What a short run measured, as a record of the job owner's (as its measured runs are: fc2/services/feedback.py)
    at the job's latency, linked to the job."""
    with transaction.atomic():
        record = PerformanceRecord.objects.create(owner_id=job.owner_id, latency_ms=job.latency_ms, **fields)
        JobRecord.objects.create(job=job, record=record)
    return record


def _too_little(profile: MissingProfile, busy_s: float, ended_after: float | None) -> str:
    """Why a profiling run that measured `busy_s` of traffic told nothing, and what to change."""
    measured = (
        f"the profiling run of a {profile.worker_type} worker measured {busy_s:.0f} s of traffic, too little to tell "
        f"its bandwidth (at least {MIN_BUSY_S:.0f} s)"
    )
    if ended_after is None:
        return (
            f"{measured}: its worker hardly communicated in the run's {settings.FC2_PROFILE_S} s (FC2_PROFILE_S) and "
            f"the {settings.FC2_RUN_START_S} s its code may take to start (FC2_RUN_START_S); run the job once with a "
            "manual cluster to see its nodes' logs"
        )
    return (
        f"{measured}: its training ended {ended_after:.0f} s after its nodes started. The run sets FC2_TRAIN_SECONDS="
        f"{settings.FC2_PROFILE_S} on its nodes (train at least that many seconds whatever the epochs, "
        "examples/README.md): make the code honour it, as examples/digits_cnn does, or give the job more epochs "
        f"(or steps per epoch) so that it trains for well over {settings.FC2_PROFILE_BUSY_S} s; if it failed, run "
        "the job once with a manual cluster to see its nodes' logs"
    )


def _watch(job: Job, cluster: ClusterInfo) -> tuple[list[Sample], float | None]:
    """The worker's samples once it has communicated long enough, its training has ended, the run's time is up, or
    the job is no longer recommending (cancelled, failed by a limit); and, where its training ended, how many seconds
    after its nodes started."""
    started = time.monotonic()
    deadline = started + settings.FC2_RUN_START_S + settings.FC2_PROFILE_S
    lost, samples = LostNodes(), []
    while True:
        alive = provisioner.alive(cluster)
        if name := lost.lost(alive):
            # Not the workload's doing: the recommend step is tried again, on a cluster made anew (tear_down_stale).
            raise TransientProvisionError(f"the profiling run's {name} was lost: {lost.said()}")
        if alive.get(WORKER) is not None:  # its machine answers: its kept samples can be read
            samples = _samples(cluster)
        busy = node_figures(WORKER, "worker", "", samples).busy_s
        if busy >= settings.FC2_PROFILE_BUSY_S or time.monotonic() >= deadline:
            return samples, None
        # The chief's code ending ends the training (a PS worker serves until the teardown); either ended, what the
        # worker measured up to now is all there is.
        if alive.get(WORKER, False) is False or alive.get(CHIEF, False) is False:
            return _samples(cluster), time.monotonic() - started
        still_recommending(job, "profiling run")
        time.sleep(POLL_S)


class LostNodes:
    """Which node of a short run's cluster is lost: one whose machine has not answered (`provisioner.alive`: None) for
    FC2_NODE_UNREACHABLE_S on end — its host gone, its link down, its instance terminated."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}  # node → since when its machine has not answered

    def lost(self, alive: Mapping[str, bool | None]) -> str | None:
        now = time.monotonic()
        for name, up in alive.items():
            if up is not None:
                self.since.pop(name, None)
            elif now - self.since.setdefault(name, now) >= settings.FC2_NODE_UNREACHABLE_S:
                return name
        return None

    @staticmethod
    def said() -> str:
        return f"its machine did not answer for {settings.FC2_NODE_UNREACHABLE_S} s"


def _samples(cluster: ClusterInfo) -> list[Sample]:
    """The samples the worker's agent has kept so far."""
    return [_sample(s) for s in provisioner.kept_samples(cluster, WORKER) if isinstance(s.get("at"), int | float)]


def _sample(kept: dict) -> Sample:
    def counter(name: str) -> int | None:
        return value if isinstance(value := kept.get(name), int) else None

    cpu = kept.get("cpu_percent")
    return Sample(
        node_id=0,
        at=datetime.fromtimestamp(kept["at"], UTC),
        cpu_percent=float(cpu) if isinstance(cpu, int | float) else None,
        bytes_sent=counter("bytes_sent"),
        bytes_recv=counter("bytes_recv"),
    )


def keep_entry(job: Job, entry: dict, cluster: dict | None = None) -> None:
    """Keep the run's entry on the job, merged by its cluster id into what the job holds now under its row lock:
    runs that overlap (explore's trials at once, each in a thread of its own) never lose each other's entry. With
    `cluster` (ClusterInfo.to_dict), that cluster becomes the job's recorded one (Job.cluster); an ended run whose
    cluster is the recorded one hands it to a run still under way, if any — so that the job records a cluster while
    any of its runs is up, and its release and the sweep find them all (`under_way`)."""
    with transaction.atomic():
        held = Job.objects.select_for_update().only("profiling_runs", "cluster").get(pk=job.pk)
        runs = list(held.profiling_runs or [])
        at = next((i for i, run in enumerate(runs) if run.get("cluster") == entry["cluster"]), len(runs))
        runs[at : at + 1] = [dict(entry)]
        recorded = held.cluster
        if cluster is not None:
            recorded = cluster
        elif entry.get("ended_at") and (recorded or {}).get("cluster_id") == entry["cluster"]:
            up = under_way(runs)
            recorded = _placeholder(job, up[-1]) if up else None
        Job.objects.filter(pk=job.pk).update(profiling_runs=runs, cluster=recorded)
    job.profiling_runs, job.cluster = runs, recorded


def under_way(runs: list) -> list[dict]:
    """The runs (entries of Job.profiling_runs) whose cluster is not known to be gone: not ended."""
    return [run for run in runs if isinstance(run, dict) and run.get("cluster") and not run.get("ended_at")]


def _placeholder(job: Job, run: dict) -> dict:
    """A run's cluster as the job records it before its nodes are known: its name, provider and region."""
    strategy = run.get("strategy") or Job.Strategy.PS
    return ClusterInfo(run["cluster"], job.provider, strategy, nodes=(), region=job.region).to_dict()


def tear_down_stale(job: Job) -> None:
    """Every profiling or trial run of the job still under way torn down and ended (a trial's with why it measured
    nothing): for a recommend step done again (its worker was lost mid-run) before anything new is made, and for the
    job's release (pipeline.release) — overlapping trials are several clusters, only one of them Job.cluster."""
    stale = under_way(job.profiling_runs or [])
    for run in stale:
        provisioner.teardown(job.provider, run["cluster"], job.region)
    if not stale:
        return
    now = timezone.now().isoformat()
    for run in stale:
        keep_entry(job, _cut_off(run, now))
    logger.info("job %s: %d run(s) a lost step left torn down", job.pk, len(stale))


def _cut_off(run: dict, now: str) -> dict:
    """A run whose step's worker was lost, ended now; a trial's says why it measured nothing."""
    lost = {"error": "the worker running it was lost before it measured anything"} if run.get("kind") == "trial" else {}
    return {**run, "ended_at": now, **lost}
