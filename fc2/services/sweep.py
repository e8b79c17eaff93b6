"""The sweep: reconciles every job that has not ended, and every ended job whose cluster is still recorded, so that a
lost worker — at any step — ends with the job moving on or failed with a reason, and nothing left running.

It runs every FC2_SWEEP_INTERVAL_S as a Celery beat task (`make run` starts beat beside the worker). It is needed
because a step's message dies with its worker: the filesystem broker consumes a message when it is fetched (acks_late
redelivers nothing) and Redis gives an unacknowledged one back only after an hour; and because nobody else watches a
running job's nodes between their reports.

How it tells a lost step from a slow one: whoever drives a job holds its lease (pipeline.Lease), renewed every few
seconds while a step runs; a step sent to the workers holds it until it is picked up. The sweep looks only at jobs
whose lease has expired or that have none, and takes each with a conditional update on the lease it saw — so two
sweeps at once (two beat ticks, two workers) handle a job once, and a message that turns up after the sweep has sent
its step again finds the lease changed and does nothing.

What it does with a job whose lease expired, by state:

- queued — the recommend message was lost: recommend is sent again.
- recommending — recommend (or the provision message) was lost: recommend again, from the job's request; it tears
  down a profiling run's or explore trial run's cluster the lost one left before it starts another, and explore's
  search goes on from the trials already recorded.
- provisioning — provision (or the bootstrap message) was lost: provision again; launch is idempotent by the
  cluster's name, so it finds what the lost one made.
- bootstrapping — bootstrap was lost midway: the job fails and its cluster is torn down. Nodes it started hold a
  report token nobody knows any more, and running the user's code twice is worse than a clear failure. But a managed
  job's restart, whose code runs again anyway, is made again from its provision (pipeline.restart_again): its
  cluster relaunched, whatever the lost bootstrap started stopped, its token revoked.
- collecting — collect (or its message) was lost: collect again; the chief's results are stored, collect only keeps
  the logs and marks the success.
- running — nobody drives it: every sweep looks at its nodes (check_running).
- ended with its cluster still recorded — its release was lost, or the teardown failed: released again, until the
  teardown succeeds.

A step sent again FC2_STEP_RESENDS times and lost again fails the job: "the worker running <step> was lost". A job run
by `submit_job --inline` whose process died (its lease expired) is adopted by the workers first — its steps are then
sent like any other job's; its nodes, whose reports went to that process, are left to check_running's fetched results.

Running jobs (check_running; run_inline calls it too): a node recorded with a final status that the job has not moved on
from (a report applied before reports were applied in one transaction) moves it on at once — and so does a managed
job's failed node, which its report left for this look: if another node's machine does not answer, the loss made it
fail and the job restarts (pipeline.node_failed); and so does a node's spot interruption notice, once the checkpoint
it asked the chief for is shipped (`_interrupted`). A node without a final status that is not alive, or that has
been silent for FC2_NODE_SILENCE_S, has the result its agent kept on the node fetched where its machine answers
(provisioner.fetch_results) and applied as if reported — the chief's success completes the job with its model. A
node that is gone and left no result fails the job; so does one whose machine does not answer (its host gone, its link
cut, its SSH server dead) and that has been silent for FC2_NODE_UNREACHABLE_S — unless the job has restarts left
(max_restarts): then its cluster is made again and it resumes from its latest checkpoint (pipeline.node_lost). A node
whose agent is alive but silent is waited for: the platform was unreachable for it, and it keeps trying — for
FC2_NODE_LOST_S; a node silent that long fails the job with its name, unless another node's machine does not answer
(a peer stalled on a lost node: the loss is what the job restarts from or fails for). Silence is counted to the end
of the look, whose SSH timeouts on a machine gone are silence too. A job whose result is unknown is never called
failed while the result can be fetched.

Orphans (reap_orphans, every pass): a cluster of this installation named for a job (`fc2-<id>-<hex>`) that no job
records — its row deleted, or the database restored from before it — is torn down and recorded (ReapedCluster: what
was removed, shown on the dashboard and in the admin). A job records its cluster's name before launching it and until
its teardown has succeeded — and each profiling or trial run's, several at once for explore's overlapping trials, in
Job.profiling_runs until it ended — so no cluster a job may still use is ever one.

Limits (fc2/services/limits.py: the time limit, FC2_JOB_TIMEOUT_S, and the whole-job budget, Job.total_budget — one
rule, "a limit crossed → stopped, with the reason"), in every state: the job fails with the reason on its timeline and
its cluster is torn down. A running job's kept results are applied first (a job that has just finished is not failed); a
collecting job, whose chief has succeeded, is left to finish. A job whose step's runner still holds it (a launch that
hangs renews its lease forever) is failed by the sweep and released by that runner when its step ends.

A pass that raises on one job goes on with the others, and tries that job again at the next pass — FC2_SWEEP_ATTEMPTS
passes in a row at most (Job.sweep_failures): then an active job ends with the error and its cluster is torn down.
An ended job whose teardown keeps failing says so once on its timeline and is tried again at every pass, since giving
up would leave its cluster running. What a job's results could not be kept (its logs, a late node's outputs) is a line
on its timeline, never a reason to keep its cluster (pipeline.release).
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from datetime import datetime, timedelta

from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile, UploadedFile
from django.db.models import F, Q
from django.utils import timezone

import provisioner
from fc2.models import Job, Node, ReapedCluster
from fc2.services import checkpoints, limits, monitoring, pipeline, pricing, profiling, reports, submissions
from fc2.services.pipeline import Lease
from provisioner import ClusterInfo

logger = logging.getLogger(__name__)
State = Job.State


def sweep() -> int:
    """One pass: every job whose lease is free or expired and that has not ended or still has a cluster. Returns how
    many jobs it took."""
    now = timezone.now()
    _enforce_limits(now)
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    pending = Q(state__in=pipeline.ACTIVE) | Q(cluster__isnull=False)
    # A job with no lease at all before it runs is an inline job its process has not claimed yet: give it the time a
    # sent step gets to start.
    unclaimed = Q(lease_until__isnull=True, created_at__gt=now - timedelta(seconds=settings.FC2_STEP_PICKUP_S))
    unclaimed &= Q(state__in=list(pipeline.STEP_OF))
    taken = 0
    for job_id, seen in (
        Job.objects.filter(free, pending).exclude(unclaimed).order_by("pk").values_list("pk", "lease_until")
    ):
        lease = Lease.take(job_id, seen)
        if lease is None:
            continue  # another sweep, or a step that has just started, has it
        taken += 1
        try:
            with lease.renewing():
                reconcile(Job.objects.get(pk=job_id), lease)
            Job.objects.filter(pk=job_id, sweep_failures__gt=0).update(sweep_failures=0)
        except Exception as exc:
            logger.exception("sweep: job %s", job_id)  # the other jobs go on
            _failed(job_id, lease, exc)
        finally:
            lease.end()
    reap_orphans()
    submissions.forget_expired_keys()
    return taken


def _failed(job_id: int, lease: Lease, error: Exception) -> None:
    """A sweep that raised on a job: tried again at the next sweep, FC2_SWEEP_ATTEMPTS times in a row at most; then
    an active job ends with the error and its cluster is torn down. An ended job's teardown that fails is said once
    on its timeline and tried again at every sweep (giving up on it would leave the cluster running)."""
    try:
        Job.objects.filter(pk=job_id).update(sweep_failures=F("sweep_failures") + 1)
        job = Job.objects.get(pk=job_id)
        if job.is_terminal:
            if job.sweep_failures == 1:
                job.log(f"tearing down its cluster failed ({error}): tried again at every sweep")
            return
        if job.sweep_failures >= settings.FC2_SWEEP_ATTEMPTS:
            reason = (
                f"the platform could not look after this job ({job.sweep_failures} sweeps in a row failed): {error}"
            )
            pipeline.fail(job, reason)
            pipeline.release(job_id, lease)
    except Exception:
        logger.exception("sweep: job %s: handling its failure failed too", job_id)  # the next sweep tries again


# pipeline.cluster_name's names: a cluster so named belongs to a job, and is an orphan when no job records it.
JOB_CLUSTER = re.compile(r"^fc2-(\d+)-[0-9a-f]{8}$")


def orphans(provider: str, region: str = "", *, every: bool = False) -> list[str]:
    """The provider's clusters of this installation that no job records: made for a job whose row is gone (deleted,
    or a database restored from before it), or, with `every`, also made by hand (`cluster up`). A job records its
    cluster's name before anything is launched (pipeline.provision; a profiling or trial run's in Job.profiling_runs,
    profiling.record_run) and until its teardown has succeeded, so nothing a live job may still use is among them."""
    recorded: set[str] = set()
    # A job's profiling and trial runs not ended are its clusters too (explore's trials at once are several); a job
    # records one of them as its cluster while any is up (profiling.keep_entry), so these are the jobs to look at.
    for cluster, runs in Job.objects.filter(Q(cluster__isnull=False) | Q(state__in=pipeline.ACTIVE)).values_list(
        "cluster", "profiling_runs"
    ):
        if cluster:
            recorded.add(cluster.get("cluster_id"))
        recorded |= {run["cluster"] for run in profiling.under_way(runs or [])}
    return [
        name
        for name in provisioner.list_clusters(provider, region)
        if name not in recorded and (every or JOB_CLUSTER.match(name))
    ]


def reap(provider: str, region: str = "", *, every: bool = False, by: str = "sweep") -> list[ReapedCluster]:
    """Tear down the provider's orphaned clusters in the region (`orphans`) and record each with what was removed."""
    reaped = []
    for name in orphans(provider, region, every=every):
        resources = provisioner.teardown(provider, name, region)
        job_name = JOB_CLUSTER.match(name)
        reaped.append(
            ReapedCluster.objects.create(
                provider=provider, region=region, cluster_name=name, job_number=int(job_name[1]) if job_name else None,
                resources=resources, by=by,
            )
        )  # fmt: skip
        logger.warning("%s cluster %s belonged to no job: torn down (%s)", provider, name, ", ".join(resources))
    return reaped


def reap_orphans() -> list[ReapedCluster]:
    """`reap` every provider this installation can run, in every region it makes clusters in. A teardown that fails
    is tried again at the next sweep."""
    reaped = []
    for provider in provisioner.PROVIDERS:
        try:
            if provisioner.unavailable(provider) is not None:
                continue
            for region in provisioner.regions(provider):
                reaped += reap(provider, region)
        except Exception:
            logger.exception("sweep: reaping %s's orphaned clusters failed", provider)
    return reaped


def reconcile(job: Job, lease: Lease) -> None:
    """Move one job on whose lease the sweep holds (see the module's docstring for what, by state)."""
    if not job.is_terminal:
        if job.driver == Job.Driver.INLINE:
            _adopt(job)
        if job.state == State.RUNNING:
            check_running(job)
        elif (crossed := _limit_crossed(job)) and job.state != State.COLLECTING:
            pipeline.fail(job, crossed)
        else:
            _recover(job, lease)
        job.refresh_from_db()
    if job.is_terminal:
        pipeline.release(job.pk, lease)


def _recover(job: Job, lease: Lease) -> None:
    """Send the lost step of a job again — or fail the job, if the step is not safe to redo or was lost too often."""
    step = pipeline.STEP_OF[job.state]
    if job.state == State.QUEUED:
        lost = f"no worker started the job within {settings.FC2_STEP_PICKUP_S} s"
    else:
        lost = f"the worker running {step} was lost"
    resent = job.resends.get(step, 0)
    # A restart's bootstrap is made again from its provision, which relaunches its cluster (pipeline.restart_again)
    again = job.state == State.BOOTSTRAPPING and pipeline.restarting(job) is not None
    if not (pipeline.STEPS[step].resumable or again) or resent >= settings.FC2_STEP_RESENDS:
        pipeline.fail(job, lost)
        return
    # The sweep holds the job's lease: nobody else writes this field meanwhile.
    Job.objects.filter(pk=job.pk).update(resends={**job.resends, step: resent + 1})
    if again:
        if pipeline.restart_again(job, lost):
            pipeline.enqueue(job, "provision", lease=lease, resume=True)
        return
    job.log(f"{lost}: {step} sent again")
    pipeline.enqueue(job, step, lease=lease, resume=job.state != State.QUEUED)


def _adopt(job: Job) -> None:
    """An inline job whose process is gone becomes the workers' (its lease expired: nobody drives it)."""
    Job.objects.filter(pk=job.pk).update(driver=Job.Driver.CELERY)
    job.driver = Job.Driver.CELERY
    job.log("the process running this job (submit_job --inline) is gone: the platform's workers take it over")


def check_running(job: Job) -> None:
    """Look at a running job's nodes: apply the results that never arrived, fail the job if a node is gone without
    one, and enforce its limits."""
    cluster = pipeline.cluster_info(job)
    if job.state != State.RUNNING or cluster is None:
        return
    # A node's final status and the job's move are written together (reports.apply_report, one transaction), so a
    # sweep sees both or neither; a job still running under a node recorded as finished — its report applied before
    # that was so — is moved on here, in the order its nodes finished, rather than waiting for its time limit; and so
    # is a managed job's failed node, once its cluster has been looked at for a lost node (pipeline.node_failed).
    for node in job.nodes.filter(status__in=Node.FINISHED).order_by("last_report_at", "pk"):
        if reports.move_on(job, node, looked=True):
            job.refresh_from_db()
            if pipeline.restarting(job) is None:  # (a restart says why on a line of its own)
                job.log(f"{node.name} had {node.status} while the job was still running: moved on by the sweep")
            return
    crossed = _limit_crossed(job)
    if not crossed and (noticed := _interrupted(job)) is not None:
        pipeline.node_lost(
            job, [noticed], f"{noticed} got a spot interruption notice: its cluster made again before it is taken back"
        )
        return
    # The agents' reports are the heartbeat (every few seconds while the command runs): only a node silent for
    # FC2_NODE_SILENCE_S — or every node of a job past a limit — is looked at on its machine, which over SSH costs a
    # connection.
    now = timezone.now()
    quiet_since = now - timedelta(seconds=settings.FC2_NODE_SILENCE_S)
    suspects = [
        node
        for node in job.nodes.exclude(status__in=Node.FINISHED)
        if crossed or monitoring.last_heard(job, node) < quiet_since
    ]
    if not suspects:
        return
    try:
        alive = provisioner.alive(cluster)
    except Exception:
        logger.exception("job %s: cannot tell whether its nodes are alive", job.pk)  # e.g. SSH: look again next time
        alive = None  # past a limit, or silent too long, it is stopped all the same: its cluster is billed meanwhile
    # Read where the machine answered: SSH to one that does not costs its connect timeout again (10 s on aws), which
    # would delay seeing the loss by as much.
    reachable = [node for node in suspects if alive is not None and alive.get(node.name) is not None]
    rescued = rescue_results(job, cluster, reachable) if reachable else set()
    job.refresh_from_db()
    if job.state != State.RUNNING:
        return  # a fetched result ended it
    if crossed:
        pipeline.fail(job, crossed)
        return
    # Silent until now, after the look: a machine that does not answer holds the look for its SSH timeouts, seconds
    # a node silent since before it has spent silent too (a lost node seen one look earlier).
    now = timezone.now()
    # A node whose machine does not answer first: a peer stalled on it (its agent running, silent) is not failed for
    # the loss, which a managed job restarts from.
    for node in sorted(suspects, key=lambda node: alive is None or alive.get(node.name, False) is not None):
        if node.name in rescued:
            continue
        running = alive.get(node.name, False) if alive is not None else None  # None: its machine does not answer
        quiet = (now - monitoring.last_heard(job, node)).total_seconds()
        if running is False:
            pipeline.fail(job, f"{node.name} stopped without reporting a result{pipeline.node_tail(job, node.name)}")
            return
        if running is None and alive is not None and quiet >= settings.FC2_NODE_UNREACHABLE_S:
            pipeline.node_lost(  # a managed job's restart (max_restarts), or its failure
                job,
                [name for name, up in alive.items() if up is None],
                f"{node.name} is lost: its machine does not answer and it has not reported for {quiet:.0f} s "
                f"(FC2_NODE_UNREACHABLE_S is {settings.FC2_NODE_UNREACHABLE_S} s): its host is gone or cut off",
            )
            return
        if quiet >= settings.FC2_NODE_LOST_S:
            state = "its agent is running" if running else "it cannot be reached"
            pipeline.fail(
                job,
                f"{node.name} has not reported for {quiet:.0f} s ({state}; FC2_NODE_LOST_S is "
                f"{settings.FC2_NODE_LOST_S} s): it cannot reach the platform, or it hangs",
            )
            return


def _interrupted(job: Job) -> str | None:
    """The node of a managed job with restarts left that got a spot interruption notice since its training last
    began (its line on the timeline, checkpoints.INTERRUPTION), once the checkpoint the notice asked its chief for has
    been shipped — or, none shipped, FC2_NODE_UNREACHABLE_S after the notice; None otherwise. Its machine is taken
    back within two minutes of the notice: restarting now, from that checkpoint, loses almost nothing, where waiting
    for the loss would stall the job until it is seen."""
    if not pipeline.may_restart(job) or (began := pipeline.training_began(job)) is None:
        return None
    # Each node's notice line begins with its name (what a node writes elsewhere on a line is not a notice)
    said = {name: f"{name}: {checkpoints.INTERRUPTION} (" for name in job.nodes.values_list("name", flat=True)}
    lines = Q()
    for start in said.values():
        lines |= Q(message__startswith=start)
    if not said or (notice := job.events.filter(lines, at__gt=began).order_by("-at", "-pk").first()) is None:
        return None
    shipped = (latest := checkpoints.latest(job)) is not None and latest.created_at > notice.at
    if not shipped and (timezone.now() - notice.at).total_seconds() < settings.FC2_NODE_UNREACHABLE_S:
        return None
    return next(name for name, start in said.items() if notice.message.startswith(start))


def rescue_results(job: Job, cluster: ClusterInfo, nodes: list[Node]) -> set[str]:
    """Apply the final reports these nodes' agents kept on the nodes, as if they had arrived — the chief's first, since
    its success completes the job. Only these nodes are read. Returns the names of the nodes whose result was
    applied."""
    names = {node.name for node in nodes}
    try:
        results = provisioner.fetch_results(replace(cluster, nodes=tuple(n for n in cluster.nodes if n.name in names)))
    except Exception:
        logger.exception("job %s: cannot fetch its nodes' kept results", job.pk)
        return set()
    chiefs = pipeline.chief_names(job)
    applied: set[str] = set()
    for node in sorted(nodes, key=lambda n: n.name not in chiefs):
        if (result := results.get(node.name)) is None or (status := result.report.get("status")) not in Node.FINISHED:
            continue
        job.refresh_from_db()
        if job.is_terminal:
            break
        files: list[UploadedFile] = [SimpleUploadedFile(name, data) for name, data in result.files.items()]
        try:
            reports.receive(job, {**result.report, "node": node.name}, files)
        except reports.ReportRejected as exc:
            logger.warning("job %s: %s's kept result refused: %s %s", job.pk, node.name, exc, exc.detail or "")
            continue
        # Written once it is applied: a sweep that fails before tries again without a line each time.
        job.log(f"{node.name} {status}; its report never arrived: the result kept on the node was fetched")
        applied.add(node.name)
    return applied


def _limit_crossed(job: Job, now: datetime | None = None) -> str | None:
    """Why the job must be stopped now — its time limit or its whole-job budget (fc2/services/limits.py) — or None."""
    now = now or timezone.now()
    return limits.limit_crossed(
        run_s=(now - job.time_limit_from).total_seconds(),
        time_limit_s=settings.FC2_JOB_TIMEOUT_S,
        cost_so_far=job.cost_so_far,
        hourly_cost=None if job.hourly_cost is None else float(job.hourly_cost),
        budget=None if job.total_budget is None else float(job.total_budget),
        interval_s=settings.FC2_SWEEP_INTERVAL_S,
        teardown_s=pricing.teardown_s(job.provider) if job.total_budget is not None else 0.0,
    )


def _enforce_limits(now: datetime) -> None:
    """The limits of jobs whose step is still held by its runner (a hung launch renews its lease forever): failed
    here, released by that runner when its step ends. Jobs with a free lease are looked at by `reconcile`."""
    limit = now - timedelta(seconds=settings.FC2_JOB_TIMEOUT_S)
    started_long_ago = Q(started_at__lt=limit) | Q(started_at__isnull=True, created_at__lt=limit)
    billed_against_a_budget = Q(total_budget__isnull=False, hourly_cost__isnull=False, launched_at__isnull=False)
    held = Job.objects.filter(
        started_long_ago | billed_against_a_budget, lease_until__gte=now, state__in=list(pipeline.STEP_OF)
    ).exclude(state=State.COLLECTING)
    for job in held:
        if crossed := _limit_crossed(job, now):
            pipeline.fail(job, crossed)
