"""The job pipeline: queued → recommending → provisioning → bootstrapping → running → collecting → succeeded.

Each step is a plain function taking the job id. It claims its step with a conditional update (Job.transition), so a
redelivered task or a step racing a cancel does nothing. Steps are chained by `advance` through Celery (tasks.py) for
jobs driven by the workers, or in one process by `inline.run_inline` (the CLI's --inline, serving the report API too).

Whoever drives a job holds its lease (`Lease`, on Job.lease_until): a step's runner from its start to its end, renewed
by a heartbeat thread; a step sent to the workers from the moment it is sent until it is picked up (the lease travels
with the message, so a message that the sweep has since replaced finds the lease changed and does nothing);
`inline.run_inline` for the whole run. Only the lease's holder tears down an ended job's cluster (`release`), so a
teardown never races the step still making that cluster: a job cancelled meanwhile is released by that step's runner
when the step ends, and whatever a step made is recorded on the job before anything else, so that it can be found and
torn down.
A lease left to expire is how the sweep (sweep.py) knows that the worker behind it is gone; the sweep also watches
running jobs' nodes, which nobody drives between their reports.

A managed job (`max_restarts`) whose node is lost — in training, or while its cluster is made or started — goes back
to provisioning (`node_lost`, claimed like a step): provision makes the lost nodes again (provisioner.relaunch) and
bootstrap starts every node from the latest checkpoint its chief shipped (`run_spec`'s restore_from), each restart
recorded on the job with the work it lost. A spot job's launch that finds no spot capacity falls back as it chose:
on-demand, or waiting (`SpotWait`).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TypeVar

from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile, UploadedFile
from django.db import DatabaseError, OperationalError, connections, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from kombu.exceptions import KombuError
from pydantic import ValidationError

import provisioner
from fc2 import jsonbounds
from fc2.models import Job, Node
from fc2.results import LOG_INTRO
from fc2.services import (
    artifacts,
    checkpoints,
    datasets,
    feedback,
    monitoring,
    noderecords,
    planning,
    pricing,
    profiling,
    trials,
)
from fc2.services.requests import JobRequest
from provisioner import (
    CapacityError,
    ClusterInfo,
    ClusterSpec,
    NodeError,
    ProvisionError,
    RunSpec,
    TransientProvisionError,
)
from provisioner.types import is_chief
from recommender.types import RecommendationError

logger = logging.getLogger(__name__)
T = TypeVar("T")
State = Job.State
ACTIVE = Job.ACTIVE
# Not `collecting`: the chief has succeeded and its results are stored, so the job can only succeed now.
CANCELLABLE = tuple(s for s in ACTIVE if s != State.COLLECTING)
LOG_TAIL_CHARS = 4000
FAILED_LOOK_S = 3.0  # how long the machines of a failed node's peers are given to answer (node_failed)


def _job(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


def cluster_info(job: Job) -> ClusterInfo | None:
    return ClusterInfo.from_dict(job.cluster) if job.cluster else None


class Lease:
    """This process's hold on a job (Job.lease_until).

    The expiry is also the lease's identity: every change is a conditional update on the value this holder last wrote,
    so once anyone else has taken the job (the sweep, after the lease expired), this holder's renewals and hand-overs
    change nothing and `lost` tells it so. Clocks of the platform's machines are assumed to agree within seconds.
    """

    def __init__(self, job_id: int, until: datetime):
        self.job_id = job_id
        self.until: datetime | None = until  # None once given up or handed over
        self.lost = False
        self._lock = threading.Lock()  # the heartbeat thread and the holder change `until` in turn

    @classmethod
    def claim(cls, job_id: int) -> Lease | None:
        """The job's lease if nobody holds it: none was taken, or it has expired."""
        now = timezone.now()
        free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
        return cls._take(Job.objects.filter(free, pk=job_id), job_id, now)

    @classmethod
    def take(cls, job_id: int, seen: datetime | None) -> Lease | None:
        """The job's lease if it is still the one `seen`: handed over with a message, or found expired by the sweep."""
        jobs = Job.objects.filter(pk=job_id)
        jobs = jobs.filter(lease_until__isnull=True) if seen is None else jobs.filter(lease_until=seen)
        return cls._take(jobs, job_id, timezone.now())

    @classmethod
    def _take(cls, jobs: QuerySet[Job], job_id: int, now: datetime) -> Lease | None:
        until = now + timedelta(seconds=settings.FC2_LEASE_S)
        return cls(job_id, until) if jobs.update(lease_until=until) else None

    @property
    def held(self) -> bool:
        return self.until is not None and not self.lost

    def _swap(self, until: datetime | None, *, keep: bool = True) -> bool:
        with self._lock:
            if not self.held:
                return False
            if Job.objects.filter(pk=self.job_id, lease_until=self.until).update(lease_until=until):
                self.until = until if keep else None
                return True
            self.lost = True
            logger.info("job %s: its lease was taken over (or handed on); this holder stops driving it", self.job_id)
            return False

    def renew(self) -> bool:
        return self._swap(timezone.now() + timedelta(seconds=settings.FC2_LEASE_S))

    def end(self) -> None:
        """Give the job up: anyone may take it now."""
        self._swap(None, keep=False)

    def hand_over(self, delay_s: float = 0) -> datetime | None:
        """Give the job to a step about to be sent (to start in `delay_s`): its lease is the returned value until it
        starts."""
        until = pickup_deadline() + timedelta(seconds=delay_s)
        return until if self._swap(until, keep=False) else None

    @contextmanager
    def renewing(self) -> Iterator[Lease]:
        """Renew the lease every third of its length while the block runs (a heartbeat thread)."""
        stop = threading.Event()

        def heartbeat() -> None:
            try:
                while not stop.wait(settings.FC2_LEASE_S / 3):
                    try:
                        if not self.renew():
                            return
                    except DatabaseError:  # e.g. a locked SQLite file: try again at the next beat
                        logger.warning("job %s: renewing its lease failed", self.job_id, exc_info=True)
            finally:
                connections.close_all()  # this thread's own connection

        thread = threading.Thread(target=heartbeat, name=f"lease-job-{self.job_id}", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()


def pickup_deadline() -> datetime:
    """Until when a step sent now holds its job's lease: not started by then, its message was lost."""
    return timezone.now() + timedelta(seconds=settings.FC2_STEP_PICKUP_S)


def _begin(job: Job, source: str, target: str, message: str, resume: bool) -> bool:
    """Claim a step: move the job from `source` to `target` — or, resuming a step whose worker was lost (the resumer
    holds the job's lease), find the job still at `target`."""
    return job.state == target if resume else job.transition(source, target, message)


def _hold(job: Job, state: str) -> None:
    """Tests only (FC2_FAULT_PAUSE): hold the step where losing its worker hurts most, so a test can kill it there."""
    if pause := settings.FC2_FAULT_PAUSE.get(state):
        logger.warning("job %s: %s held for %s s (FC2_FAULT_PAUSE)", job.pk, state, pause)
        time.sleep(pause)


def recommend(job_id: int, *, resume: bool = False, **_: object) -> bool:
    """Plan the cluster from the job's request (`planning.plan`, as the wizard previewed it) and store the plan on
    the job — for Scala-Opt lacking a worker type's bandwidth, after a profiling run that measures it
    (fc2/services/profiling.py); for explore, after the trial runs its search asks for (fc2/services/trials.py).
    Done again from the request when its worker was lost: a profiling or trial cluster the lost step left is torn
    down first, and explore's search goes on from the trials already made."""
    job = _job(job_id)
    if not _begin(job, State.QUEUED, State.RECOMMENDING, "choosing the cluster", resume):
        return False
    _hold(job, State.RECOMMENDING)
    profiling.tear_down_stale(job)
    datasets.ready(job.dataset)
    asked = JobRequest.of(job)
    # The platform's records and the owner's; explore's search within what this job's trials have spent of its budget
    chosen = planning.plan(asked, job.owner_id, trials_spent=trials.spent(job))
    if chosen.missing:  # Scala-Opt without b_t: measure it, then plan again
        profiling.measure(job, chosen.missing, run_spec(job))
        chosen = planning.plan(asked, job.owner_id)
        if chosen.missing:
            raise RecommendationError(f"the profiling run measured no bandwidth: {chosen.explanation}")
    if asked.algorithm == "explore":  # its trials, until the search stops; then the cluster it chose
        chosen = trials.search(job, asked, chosen, run_spec(job))
    _store(job, chosen)
    types = (
        f" ({job.ps_type or 'any'} PS, {job.worker_type or 'any'} workers)" if job.ps_type or job.worker_type else ""
    )
    left_open = " (left open: the model's choice)" if job.strategy_chosen else ""
    job.log(f"{job.algorithm} cluster: {job.workers} workers{types}, strategy {job.get_strategy_display()}{left_open}")
    return True


def _store(job: Job, plan: planning.Plan) -> None:
    """Write the plan on the job — the cluster it runs on, its $/h as planned — where the recommend step (or a
    relaunch out of capacity) chose it."""
    Job.objects.filter(pk=job.pk).update(**plan.columns())
    job.refresh_from_db()
    if plan.recommendation is not None:
        job.log(f"recommendation: {plan.explanation}")


def cluster_name(job: Job) -> str:
    """The job's cluster name, made once: the job id for people, a random part so that another installation on the
    same machine (another checkout, `make test` beside `make run`) never has a cluster of the same name."""
    if not job.cluster_name:
        Job.objects.filter(pk=job.pk, cluster_name="").update(cluster_name=f"fc2-{job.pk}-{secrets.token_hex(4)}")
        job.cluster_name = Job.objects.values_list("cluster_name", flat=True).get(pk=job.pk)
    return job.cluster_name


def provision(job_id: int, *, resume: bool = False, **_: object) -> bool:
    """Launch the cluster. Launching is idempotent by the cluster's name, so a lost provision is simply done again."""
    job = _job(job_id)
    if not _begin(job, State.RECOMMENDING, State.PROVISIONING, f"launching the cluster on {job.provider}", resume):
        return False
    if job.cluster is None:  # the name first: a launch that dies part-way is torn down by it (release)
        empty = ClusterInfo(cluster_name(job), job.provider, job.strategy, nodes=(), region=job.region)
        # Its billing starts here, before anything is made: every node is billed from its launch.
        Job.objects.filter(pk=job.pk, cluster__isnull=True).update(cluster=empty.to_dict(), launched_at=timezone.now())
        job.refresh_from_db(fields=["cluster", "launched_at"])  # a spot job is billed from it (pricing.bill)
    cluster = _launch(job)
    _hold(job, State.PROVISIONING)  # launched, not yet recorded
    # Recorded whatever happened meanwhile: a job cancelled while its cluster was launched must still have it torn down.
    Job.objects.filter(pk=job.pk).update(cluster=cluster.to_dict())
    job.refresh_from_db()
    if job.state != State.PROVISIONING:
        return False
    Node.objects.bulk_create(
        [
            Node(job=job, name=n.name, role=n.role, index=n.index, instance_type=n.instance_type, address=n.address)
            for n in cluster.nodes
        ],
        ignore_conflicts=True,
    )
    if restarting(job) is not None:  # its nodes are where the relaunch put them
        for n in cluster.nodes:
            job.nodes.filter(name=n.name).update(instance_type=n.instance_type, address=n.address)
        _update_restart(job, relaunched_at=timezone.now().isoformat())
        restart_text = f" (restart {len(job.restarts)})"
    else:
        restart_text = ""
    job.log("nodes: " + ", ".join(f"{n.name} at {n.address}" for n in cluster.nodes) + restart_text)
    return True


def _launch(job: Job) -> ClusterInfo:
    """Launch the job's cluster. A cloud out of capacity for the worker type in every zone (the provider tries them
    all) has the recommender choose again without that type, within the same budget, until one launches. A spot job's
    cluster is billed from each launch at its market's price (pricing.bill): spot, or on-demand once it fell back —
    its relaunches too."""
    if job.workers is None:  # planned by the recommend step, which runs before
        raise ProvisionError("the job has no planned cluster to launch")
    unavailable: list[str] = []
    # A resume makes the cluster again from what is left of it (provisioner.relaunch); once, before any failover.
    # Made again after its bootstrap was lost (restart_again), its lost nodes' places hold the instances its first
    # relaunch made: only the machines that do not answer are replaced.
    restart = restarting(job)
    old = cluster_info(job) if restart is not None and "relaunched_at" not in restart else None
    lost = restart["nodes"] if restart is not None and not restart.get("redone_at") else ()
    spot = job.spot and pricing.market(job) == pricing.SPOT
    while True:
        if job.spot and (said := pricing.bill(job, spot)):
            job.log(said)
        spec = ClusterSpec(
            cluster_id=cluster_name(job),
            provider=job.provider,
            strategy=job.strategy,
            workers=job.workers,
            ps_type=job.ps_type,
            worker_type=job.worker_type,
            region=job.region,
            latency_ms=job.latency_ms,
            job_id=job.pk,
            spot=spot,
            spot_max_price=float(job.spot_max_price) if spot and job.spot_max_price is not None else None,
        )
        try:
            if old is not None:
                return provisioner.relaunch(spec, old, lost, notify=job.log)
            return provisioner.launch(spec, notify=job.log)
        except CapacityError as error:
            old = None  # the failed launch removed what it made: the next is made whole
            if spot:  # as the job chose: wait for spot capacity (its step tried again), or on-demand now
                if job.spot_fallback == Job.SpotFallback.WAIT:
                    raise SpotWait(f"{error}: waiting for spot capacity (spot_fallback wait)") from error
                job.log(f"{error}: on-demand instances instead (spot_fallback on-demand)")
                spot = False
                continue
            if job.algorithm in planning.ONE_WORKER_TYPE or error.instance_type != job.worker_type:
                raise
            unavailable.append(job.worker_type)
            job.log(f"{error}: asking the recommender for its next worker type")
            # The strategy already planned is kept: its nodes may be up.
            asked = replace(JobRequest.of(job), strategy=job.strategy)
            try:
                again = planning.plan(asked, job.owner_id, blocked=unavailable, trials_spent=trials.spent(job))
            except RecommendationError as refused:
                raise ProvisionError(str(refused)) from error
            if again.search is not None:  # explore: its search is over, and no measured cluster is left to run on
                raise ProvisionError(f"{error}, and explore measured no other cluster to run on") from error
            _store(job, again)


class SpotWait(TransientProvisionError):
    """No spot capacity for a job that waits for it (spot_fallback wait): its provision is tried again with backoff,
    without a limit on attempts, until capacity comes back or the job's time limit or budget stops it (the sweep)."""

    waits = True


def run_spec(job: Job) -> RunSpec:
    """What the job's nodes run: its bundle, parameters and dataset, within the platform's limits (no report URL or
    token: the bootstrap adds the job's; a profiling or trial run reports to nobody)."""
    return RunSpec(
        job_id=job.pk,
        wheel_path=job.bundle.wheel.path,
        main_module=job.bundle.main_module,
        args=tuple(f"--{key}={value}" for key, value in job.parameters.items()),
        dataset=job.dataset.path,
        timeout_s=settings.FC2_JOB_TIMEOUT_S,
        max_artifact_mb=settings.FC2_MAX_ARTIFACT_MB,
        max_dataset_mb=settings.FC2_MAX_DATASET_MB,
        fetch_allow=tuple(settings.FC2_DATASET_ALLOWED_NETWORKS),
        restore_from=_restore_from(job),
        orphan_s=settings.FC2_NODE_ORPHAN_S,
        framework=job.framework,
    )


def _restore_from(job: Job) -> str:
    """The checkpoint a resumed job's nodes restore from: its latest (checkpoints.latest); "" before any restart, or
    when its chief has shipped none (the run starts again from the start)."""
    if not job.restarts or (latest := checkpoints.latest(job)) is None:
        return ""
    return latest.file.path


def bootstrap(job_id: int, report_url: str | None = None, **_: object) -> bool:
    """Install the bundle and start the nodes. Not resumable: nodes a lost bootstrap started hold a report token that
    nobody knows any more, so the sweep fails such a job rather than run the user's code twice."""
    job = _job(job_id)
    message = "installing the bundle and starting the nodes"
    if not _begin(job, State.PROVISIONING, State.BOOTSTRAPPING, message, resume=False):
        return False
    token = job.issue_token()
    if not Job.objects.filter(pk=job.pk, state=State.BOOTSTRAPPING).update(token_hash=job.token_hash):
        return False  # cancelled before anything started
    run = replace(run_spec(job), report_url=report_url or settings.FC2_PUBLIC_URL, token=token)
    if (launched := cluster_info(job)) is None:  # recorded by the provision step, which runs before
        raise ProvisionError("the job has no launched cluster to bootstrap")
    cluster = provisioner.bootstrap(launched, run)
    _hold(job, State.BOOTSTRAPPING)  # nodes started, not yet recorded
    # Recorded whatever happened meanwhile, with the processes just started: a job cancelled during the start is torn
    # down by this step's runner (it holds the lease, so no teardown ran meanwhile) and must find them.
    Job.objects.filter(pk=job.pk).update(cluster=cluster.to_dict())
    if (restart := restarting(job)) is None:
        return job.transition(State.BOOTSTRAPPING, State.RUNNING, f"{len(cluster.nodes)} nodes started")
    # Resumed: its run goes on (its start, time limit and cost count from the first), its nodes heard from now.
    now = timezone.now()
    # (the checkpoint is the one the loss found: the old nodes, their token revoked, can ship none since)
    resumed = {
        **restart,
        "resumed_at": now.isoformat(),
        "checkpoint": restart["checkpoint"] if run.restore_from else "",
    }
    source = f"from checkpoint {resumed['checkpoint']}" if resumed["checkpoint"] else "from the start (no checkpoint)"
    message = f"{len(cluster.nodes)} nodes started again {source}: restart {len(job.restarts)} of {job.max_restarts}"
    kept = {"started_at": job.started_at} if job.started_at else {}
    if not job.transition(State.BOOTSTRAPPING, State.RUNNING, message, restarts=[*job.restarts[:-1], resumed], **kept):
        return False
    job.nodes.update(last_report_at=now)
    return True


def node_tail(job: Job, node_name: str) -> str:
    """The end of the node's log as a failure reason's "; its log ends: …" (nothing without a log)."""
    cluster = cluster_info(job)
    log = provisioner.fetch_logs(cluster).get(node_name, "") if cluster else ""
    # What the node's code printed: a NUL in it would make the failure unwritable on PostgreSQL.
    return f"{LOG_INTRO}{jsonbounds.clean_text(log[-LOG_TAIL_CHARS:])}" if log.strip() else ""


def complete(job: Job) -> bool:
    """The chief reported success: collect the results (the completion report moves the job on, FC² §6)."""
    if not job.transition((State.BOOTSTRAPPING, State.RUNNING), State.COLLECTING, "the chief finished training"):
        return False
    enqueue(job, "collect")
    return True


def collect(job_id: int, **_: object) -> bool:
    """Keep the nodes' logs beside the chief's stored results: the job has succeeded. The cluster is torn down after
    (release, by the same runner), so that the job does not wait in `collecting` while its servers stop. Done again
    as it is when its worker was lost."""
    job = _job(job_id)
    if job.state != State.COLLECTING:
        return False
    _hold(job, State.COLLECTING)
    if cluster := cluster_info(job):
        _guarded(job, "keeping the nodes' logs", _keep_logs, job, cluster)  # the job has succeeded all the same
    if not job.transition(State.COLLECTING, State.SUCCEEDED, "results stored"):
        return False
    ended(job)
    return True


def fail(job: Job, reason: str, *, release_now: bool = False) -> bool:
    """Fail the job. Its cluster is released by a release task — or, while a runner holds the job's lease, by that
    runner when its step ends; `release_now` releases here instead, for a caller that holds no lease and may wait."""
    if not job.transition(ACTIVE, State.FAILED, reason[:2000], failure_reason=reason):
        return False
    ended(job)
    if release_now:
        release(job.pk)
    else:
        enqueue(job, "release")
    return True


# Where a lost node restarts its job from: its run, or its start (a node lost while provisioning or bootstrapping).
RESTARTABLE = (State.PROVISIONING, State.BOOTSTRAPPING, State.RUNNING)


def node_lost(job: Job, nodes: Sequence[str], reason: str) -> bool:
    """Nodes of an active job are lost — their hosts gone, their links down, their instances terminated or taken back
    (spot) — or a node was lost while the cluster was made or started. With restarts left (`Job.max_restarts`) the
    job gets its cluster back: the restart is recorded with the work lost since the last checkpoint, the job moved
    back to provisioning (claimed like a step, by a conditional update; its report token revoked, so that the old
    nodes' reports are refused from now on) and provision sent again, which relaunches the lost nodes; bootstrap
    then starts every node from the latest checkpoint. Without, it fails as before, naming the nodes and the restarts
    made. Returns whether it was restarted. The caller holds the job's lease (the sweep, or a step's runner)."""
    job.refresh_from_db()
    made = len(job.restarts)
    if made >= job.max_restarts:
        fail(job, f"{reason}{restarts_made(job)}")
        return False
    lost = _interruption(job, nodes, reason)
    message = f"restart {made + 1} of {job.max_restarts}: {reason} — {lost_work_text(lost)}"
    if not job.transition(
        RESTARTABLE, State.PROVISIONING, message[:2000], restarts=[*job.restarts, lost], token_hash=""
    ):
        return False
    job.nodes.update(status=Node.Status.PENDING, exit_code=None)
    enqueue(job, "provision", resume=True)
    return True


def restarts_made(job: Job) -> str:
    """The restarts a failing managed job made, as its failure reason ends: each with its nodes and when it was."""
    if not job.max_restarts:
        return ""
    each = "; ".join(
        f"{number}: {', '.join(r['nodes']) or 'its cluster'} at {datetime.fromisoformat(r['at']):%H:%M:%S}"
        for number, r in enumerate(job.restarts, 1)
    )
    return f"; restarts made: {len(job.restarts)} of {job.max_restarts}" + (f" ({each})" if each else "")


def may_restart(job: Job) -> bool:
    """Whether a lost node would restart the job rather than fail it: restarts left, in a state it restarts from."""
    return job.state in RESTARTABLE and len(job.restarts) < job.max_restarts


def node_failed(job: Job, reason: str, *, looked: bool = False) -> bool:
    """A node's code failed (its report says so): the job fails — unless another node was lost, which a managed job
    restarts from. A lost node makes its peers fail too (a parameter server gone fails the chief's calls to it, a
    peer gone a mirrored worker's all-reduce), often before the loss is seen, and the failure its peer reports is
    then the loss's, not the code's. So a job with restarts left has its nodes' machines looked at first — by its
    driver (`looked`: the sweep or the inline runner, check_running), not in the report's transaction, which an SSH
    connection's timeout would hold: until then it stays running, said once on its timeline. A node failing once
    its chief has succeeded (collecting: a mirrored worker that outlived it, its peer gone) fails nothing: the job's
    results are stored, it can only succeed. Whether it moved on."""
    what = reason.partition(LOG_INTRO)[0]
    if job.state == State.COLLECTING:
        job.log(f"{what} after the chief succeeded: the job's results are kept")
        return False
    if not may_restart(job):
        return fail(job, reason)
    if not looked:
        job.log(f"{what}: its cluster is looked at for a lost node first (restarts left)")
        return False
    cluster = cluster_info(job)
    # Briefly: a node not answering that quickly only turns what would be a failure into a restart
    silent = [name for name, up in provisioner.answering(cluster, FAILED_LOOK_S).items() if not up] if cluster else []
    if not silent:
        return fail(job, reason)
    machines = "its machine does" if len(silent) == 1 else "their machines do"
    return node_lost(job, silent, f"{', '.join(silent)} lost ({machines} not answer): {what}")


def restart_again(job: Job, reason: str) -> bool:
    """The worker starting a restart's nodes was lost (bootstrap, which may not be done again): the restart is made
    again from its provision rather than the job failed — its cluster relaunched (provisioner.relaunch settles or
    replaces whatever the lost bootstrap started) and its report token revoked — without counting another restart,
    since no node was lost. Its lost nodes were replaced by its first relaunch (`redone_at`): those instances are
    kept where they answer, not replaced twice. Whether it was; the caller (the sweep) holds the job's lease and
    sends provision."""
    if job.state != State.BOOTSTRAPPING or (restart := restarting(job)) is None:
        return False
    again = {key: value for key, value in restart.items() if key != "relaunched_at"}
    again["redone_at"] = timezone.now().isoformat()
    message = f"{reason}: restart {len(job.restarts)} of {job.max_restarts} made again from its provision"
    if not job.transition(
        State.BOOTSTRAPPING, State.PROVISIONING, message, restarts=[*job.restarts[:-1], again], token_hash=""
    ):
        return False
    job.nodes.update(status=Node.Status.PENDING, exit_code=None)
    return True


def restarting(job: Job) -> dict | None:
    """The restart under way (its nodes not started again yet), or None."""
    return job.restarts[-1] if job.restarts and not job.restarts[-1].get("resumed_at") else None


def _update_restart(job: Job, **fields: object) -> None:
    """Add `fields` to the restart under way (the caller holds the job's lease: nobody else writes it meanwhile)."""
    job.restarts = [*job.restarts[:-1], {**job.restarts[-1], **fields}]
    Job.objects.filter(pk=job.pk).update(restarts=job.restarts)


def lost_work_text(restart: dict) -> str:
    """The work a restart lost, as the timeline says it."""
    steps = "" if restart["lost_steps"] is None else f"{restart['lost_steps']} steps, "
    since = f"checkpoint {restart['checkpoint']}" if restart["checkpoint"] else "the start of its training"
    return f"work lost since {since}: {steps}{restart['lost_s']:.0f} s, ${restart['lost_dollars']:.4f}"


def _interruption(job: Job, nodes: Sequence[str], reason: str) -> dict:
    """A restart as recorded: when the loss was seen, the nodes, why, and the work lost since the last checkpoint —
    the training since then (or since training began again, if later), in the chief's steps, seconds and $ of the
    cluster's cost. The cost itself goes on being billed: the job's cost and its whole-job budget include it."""
    now = timezone.now()
    checkpoint = checkpoints.latest(job)
    began = training_began(job)
    since = max(began, checkpoint.created_at) if began and checkpoint else began
    lost_s = max(0.0, (now - since).total_seconds()) if since else 0.0
    # From the checkpoint's own step (its agent's) when it was saved in this run of the training: steps resumed from
    # it on another number of workers are other steps.
    step = checkpoint.step if checkpoint and since == checkpoint.created_at else None
    return {
        "at": now.isoformat(),
        "nodes": list(nodes),
        "reason": reason,
        "state": job.state,
        "lost_steps": monitoring.steps_since(job, chief_names(job), began, since, step) if since else 0,
        "lost_s": round(lost_s, 1),
        "lost_dollars": round(float(job.hourly_cost or 0) * lost_s / 3600, 6),
        "checkpoint": Path(checkpoint.name).name if checkpoint else "",
        "resumed_at": None,
    }


def training_began(job: Job) -> datetime | None:
    """When its nodes last started training: at its last resume, else when it began running; None before."""
    if job.state != State.RUNNING:
        return None
    resumed = [r["resumed_at"] for r in job.restarts if r.get("resumed_at")]
    return datetime.fromisoformat(resumed[-1]) if resumed else job.started_at


def cancel(job: Job, by: str) -> bool:
    """Cancel a job that has not finished training. Answers at once: the cluster is torn down in the background (a
    release task, or the runner holding the job), the job shown as cancelling until it is gone."""
    if not job.transition(CANCELLABLE, State.CANCELLED, f"cancelled by {by}"):
        return False
    ended(job)
    enqueue(job, "release")
    return True


def ended(job: Job) -> None:
    """What a job that has just ended leaves: its run figures, kept on it (monitor/figures.py: no report is taken
    any more), and its performance record (feedback.record_job), which the recommender reads at once. Neither may
    stop the job from ending: a failure is logged (in a savepoint of its own, so a caller's transaction goes on)."""
    try:
        with transaction.atomic():
            Job.objects.filter(pk=job.pk).update(figures=monitoring.compute_figures(job))
            job.refresh_from_db()
            feedback.record_job(job)
    except Exception:
        logger.exception("job %s: its figures or its performance record could not be kept", job.pk)


def release(job_id: int, lease: Lease | None = None) -> bool:
    """Tear down an ended job's cluster, keeping its nodes' logs first (collect has kept a successful job's).

    Only the job's lease holder does it: the caller, if it passes its `lease`, or else this call, if nobody holds the
    lease (a runner that does will release the job itself when its step ends). The cluster stays recorded until the
    teardown has succeeded, so a release whose worker died, or whose teardown failed, is done again by the sweep.
    """
    own = lease or Lease.claim(job_id)
    if own is None or not own.held:
        return False
    try:
        with nullcontext() if lease else own.renewing():
            job = _job(job_id)
            if not job.is_terminal or job.cluster is None:
                return False
            cluster = ClusterInfo.from_dict(job.cluster)
            # What the nodes leave is kept first, but nothing may keep the cluster up: a failure is a line on the
            # job's timeline, and the teardown runs all the same.
            waited = _guarded(job, "waiting for the workers to finish", _let_workers_finish, job, cluster)
            # A job that did not succeed may have lost a machine: each read of one that does not answer costs an SSH
            # connect timeout (10 s on aws), so they are asked once whether they answer, and only those are read.
            left = cluster if job.state == State.SUCCEEDED else _answering(cluster)
            if waited is not False or job.state != State.SUCCEEDED:
                _guarded(job, "keeping the nodes' logs", _keep_logs, job, left)
            _guarded(job, "keeping the reports of nodes that finished late", _keep_late_reports, job, left)
            profiling.tear_down_stale(job)  # explore's trials at once: each its own cluster, one of them Job.cluster
            provisioner.teardown(cluster.provider, cluster.cluster_id, cluster.region)
            Job.objects.filter(pk=job.pk).update(cluster=None, torn_down_at=timezone.now())  # its billing ends
            job.nodes.exclude(status__in=Node.FINISHED).update(status=Node.Status.STOPPED)
            _guarded(job, "writing the teardown on the timeline", job.log, f"cluster {cluster.cluster_id} torn down")
            return True
    finally:
        if lease is None:
            own.end()


def _guarded(job: Job, what: str, action: Callable[..., T], *args: object) -> T | None:
    """Do what an ending job keeps (its logs, late outputs) and return what it gave; a failure becomes a line on its
    timeline (or, if even that cannot be written, the log) and None, instead of stopping the caller — which goes on to
    tear the cluster down."""
    try:
        return action(*args)
    except Exception as exc:
        logger.exception("job %s: %s failed", job.pk, what)
        try:
            job.log(f"{what} failed: {exc}")
        except Exception:
            logger.exception("job %s: the failure could not be written on its timeline", job.pk)
        return None


def _answering(cluster: ClusterInfo) -> ClusterInfo:
    """The cluster less its nodes whose machines do not answer; the whole cluster if that cannot be told."""
    try:
        alive = provisioner.alive(cluster)
    except Exception:
        logger.exception("cluster %s: cannot tell which of its machines answer", cluster.cluster_id)
        return cluster
    return replace(cluster, nodes=tuple(node for node in cluster.nodes if alive.get(node.name) is not None))


def _keep_logs(job: Job, cluster: ClusterInfo) -> None:
    nodes = {node.name: node for node in job.nodes.all()}
    for name, log in provisioner.fetch_logs(cluster).items():
        artifacts.store_artifact(job, f"logs/{name}.log", log.encode(), node=nodes.get(name))


def _let_workers_finish(job: Job, cluster: ClusterInfo) -> bool:
    """Wait (up to FC2_WORKERS_FINISH_S) for the workers of a succeeded mirrored job, which end on their own just after
    its chief; True if there were any to wait for. Parameter-server tasks serve until killed: never waited for."""
    if job.state != State.SUCCEEDED or job.strategy != Job.Strategy.MIRRORED:
        return False
    deadline = time.monotonic() + settings.FC2_WORKERS_FINISH_S
    waited = False
    while any(provisioner.alive(cluster).values()) and time.monotonic() < deadline:
        waited = True
        time.sleep(0.2)
    return waited


def _keep_late_reports(job: Job, cluster: ClusterInfo) -> None:
    """The final reports of nodes that finished after their job ended (a mirrored worker just after its chief), which
    the platform refused as they came: fetched from the results their agents kept on the nodes and written on the
    nodes' records — status, exit code, log tail, last samples, outputs. Nothing a node produced is lost to the
    teardown, and a node that finished is not shown as stopped by it."""
    late = {node.name: node for node in job.nodes.exclude(status__in=Node.FINISHED)}
    if not late:
        return
    for name, result in provisioner.fetch_results(cluster).items():
        if name not in late or result.report.get("status") not in Node.FINISHED:
            continue
        try:
            report = noderecords.Report.model_validate({**result.report, "node": name})
        except ValidationError as exc:
            job.log(f"{name}: the result kept on the node is no valid report ({exc.error_count()} errors); not kept")
            continue
        files: list[UploadedFile] = [SimpleUploadedFile(wire, data) for wire, data in result.files.items()]
        for line in noderecords.record(job, late[name], report, files).lines:
            job.log(line)


def chief_names(job: Job) -> set[str]:
    return {n.name for n in job.nodes.all() if is_chief(job.strategy, n.role, n.index)}


@dataclass(frozen=True)
class Step:
    """One step of the pipeline, as every driver (the Celery chain, `inline.run_inline`, the sweep) reads it."""

    run: Callable[..., bool]  # the service function: takes the job id, returns whether the job may go on
    owns: tuple[str, ...]  # the states the job is in while it runs (the sweep finds a lost step by them)
    next: str | None = None  # the step sent once it succeeded (None: the nodes' reports, or nothing, move the job on)
    resumable: bool = False  # may be done again when its worker was lost or it failed transiently


# The pipeline's one table, in order. A running job has no step: its nodes' reports move it on, the sweep watches it.
# `bootstrap` may not be done again (see bootstrap for why).
STEPS = {
    "recommend": Step(recommend, owns=(State.QUEUED, State.RECOMMENDING), next="provision", resumable=True),
    "provision": Step(provision, owns=(State.PROVISIONING,), next="bootstrap", resumable=True),
    "bootstrap": Step(bootstrap, owns=(State.BOOTSTRAPPING,)),
    "collect": Step(collect, owns=(State.COLLECTING,), resumable=True),
}
FIRST_STEP = "recommend"
STEP_OF = {state: name for name, step in STEPS.items() for state in step.owns}  # a state -> the step that owns it


def task_name(step: str) -> str:
    """The Celery task that runs `step` (one of STEPS, or `release`): fc2/tasks.py registers one under this name for
    each, and `enqueue` sends by it. The names are those the tasks had when they were written by hand, so that a
    message an older installation left in the queue still finds its task."""
    return f"fc2.tasks.{step}"


class TryAgain(Exception):
    """A resumable step failed transiently (a cloud API throttling, a node not answering yet): its driver runs it
    again in `delay_s` — the Celery chain through its task's retry, with the job's lease handed to that message
    (`lease`), the inline driver in its own process."""

    def __init__(self, step: str, delay_s: float, lease: datetime | None = None, waits: bool = False):
        super().__init__(f"{step} is tried again in {delay_s:g} s")
        self.step = step
        self.delay_s = delay_s
        self.lease = lease
        self.waits = waits  # waiting its turn (no room on the machine yet): tried again without a limit


def advance(step: str, job_id: int, lease: str | None = None, resume: bool = False, attempt: int = 1) -> None:
    """Run one step of a Celery-driven job under its lease, then send the next step, or release the job if it ended.

    `lease` is the lease handed over with the message: once it is no longer the job's (the sweep sent the step again
    meanwhile, or a runner has the job), the message is stale and does nothing. A transient failure raises TryAgain
    with the lease handed on to the retry, which its task sends (fc2/tasks.py).
    """
    held = Lease.take(job_id, datetime.fromisoformat(lease)) if lease else Lease.claim(job_id)
    if held is None:
        logger.info("job %s: %s not run: the job's lease is no longer this message's", job_id, step)
        return
    with held.renewing():
        try:
            ok = run_step(step, job_id, resume=resume, attempt=attempt)
        except TryAgain as again:
            again.lease = held.hand_over(again.delay_s)
            if again.lease is None:
                return  # the lease was lost meanwhile: whoever took the job over drives it
            raise
        if ok and (after := STEPS[step].next):
            enqueue(_job(job_id), after, lease=held)
        else:
            release(job_id, held)  # only if the job has ended (cancelled, failed) and has a cluster
    held.end()


def run_step(step: str, job_id: int, attempt: int = 1, **kwargs: object) -> bool:
    """Run a step (`attempt` counts from 1); one that raises fails its job — unless the database could not be
    reached, which is not the job's fault: that is left to the task's retry, or to the sweep once the lease has
    expired. A transient provisioning error has a resumable step tried again, FC2_STEP_ATTEMPTS times in all with
    backoff (TryAgain: its driver waits, not this call), or without a limit when it waits its turn (`waits`: no room
    on the machine yet); anything else fails the job with its message at once."""
    try:
        return STEPS[step].run(job_id, **kwargs)
    except OperationalError:
        raise
    except ProvisionError as exc:
        if exc.transient and STEPS[step].resumable and (attempt < settings.FC2_STEP_ATTEMPTS or exc.waits):
            delay = min(2**attempt, 30)
            if attempt == 1 or not exc.waits:  # a wait for its turn (NoRoomError) is said once, however long
                _job(job_id).log(f"{step}: {exc} — trying again in {delay} s (attempt {attempt + 1})")
            raise TryAgain(step, delay, waits=exc.waits) from exc
        logger.warning("job %s: step %s failed: %s", job_id, step, exc)
        if (lost := _lost_nodes(step, _job(job_id), exc)) is not None:
            node_lost(_job(job_id), lost, f"{step} failed: {exc}")  # a restart, or the job fails
            return False
        fail(_job(job_id), f"{step} failed: {exc}")
        return False
    except Exception as exc:
        logger.exception("job %s: step %s failed", job_id, step)
        fail(_job(job_id), f"{step} failed: {exc}")
        return False


def _lost_nodes(step: str, job: Job, error: ProvisionError) -> list[str] | None:
    """The nodes a failed provision or bootstrap of a managed job lost, when that is why it failed (a node lost while
    its cluster was made or started is replaced like one lost in training, and once its restarts are spent fails the
    job naming them, as one lost in training does): those whose machines do not answer; None otherwise (its code's
    install failing, no capacity: no restart mends those)."""
    if step not in ("provision", "bootstrap") or not job.max_restarts:
        return None
    if isinstance(error, CapacityError) or not isinstance(error, NodeError):
        return None
    cluster = cluster_info(job)
    silent = [name for name, up in provisioner.answering(cluster).items() if not up] if cluster else []
    return silent if silent or step == "provision" else None


def enqueue(job: Job, step: str, *, lease: Lease | None = None, resume: bool = False) -> None:
    """Send `step` to the workers once the current transaction commits; inline jobs drive themselves.

    A step goes with the job's lease: handed over from `lease` if the sender holds it (a finishing step, the sweep),
    else set outright (a new job, a chief's completion). `release` goes without: it claims the lease when it is free.
    """
    if job.driver != Job.Driver.CELERY:
        return
    kwargs: dict = {"resume": True} if resume else {}
    if step != "release":
        until = pickup_deadline() if lease is None else lease.hand_over()
        if until is None:
            return  # the lease was lost: whoever took the job over decides what comes next
        if lease is None:
            Job.objects.filter(pk=job.pk).update(lease_until=until)
        kwargs["lease"] = until.isoformat()
    transaction.on_commit(lambda: _send(job.pk, step, kwargs))


def _send(job_id: int, step: str, kwargs: dict) -> None:
    """Send a step to the workers. With the broker unreachable the job is kept, not lost nor refused: it waits, says
    so on its timeline, and the sweep sends the step again once a worker is back (its lease has expired by then). The
    caller — a submission answering its client — goes on: the job exists and will run, exactly once."""
    from fc2.celery import app

    try:
        app.send_task(task_name(step), args=[job_id], kwargs=kwargs, queue=settings.CELERY_TASK_DEFAULT_QUEUE)
    except (KombuError, OSError) as exc:
        logger.warning("job %s: %s could not be sent: %s", job_id, step, exc)
        after = "its cluster is torn down" if step == "release" else f"{step} is sent again"
        _job(job_id).log(f"waiting for a worker: the task queue cannot be reached ({exc}); {after} once it is back")
