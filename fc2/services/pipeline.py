"""The job pipeline: queued → profiling → provisioning → bootstrapping → running → collecting → succeeded.

Each step is a plain function taking the job id. It claims its step with a conditional update (Job.transition), so a
redelivered task or a step racing a cancel does nothing; when it loses a race after making something (a cluster, a
process), it tears that down. Steps are chained by `advance`: through Celery (tasks.py) for jobs driven by the
worker, or in this process by `run_inline` (the CLI's --inline, which also serves the report API itself).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.utils import timezone

import provisioner
from fc2.models import Artifact, Job, Node
from fc2.services import datasets
from provisioner import ClusterInfo, ClusterSpec, RunSpec, local
from provisioner.types import is_chief
from recommender.types import RecommendRequest

if TYPE_CHECKING:
    from fc2.services.jobs import JobRequest

logger = logging.getLogger(__name__)
State = Job.State
ACTIVE = tuple(s for s in State.values if s not in Job.TERMINAL)
LOG_TAIL_CHARS = 4000


def _job(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


def _cluster(job: Job) -> ClusterInfo | None:
    return ClusterInfo.from_dict(job.cluster) if job.cluster else None


def profile(job_id: int, **_) -> bool:
    job = _job(job_id)
    if not job.transition(State.QUEUED, State.PROFILING, "choosing the cluster"):
        return False
    datasets.ready(job.dataset)
    if job.algorithm != "manual":
        _recommend(job)
    Job.objects.filter(pk=job.pk).update(hourly_cost=hourly_cost(job))
    types = (
        f" ({job.ps_type or 'any'} PS, {job.worker_type or 'any'} workers)" if job.ps_type or job.worker_type else ""
    )
    job.log(f"{job.algorithm} cluster: {job.workers} workers{types}, strategy {job.get_strategy_display()}")
    return True


def hourly_cost(job: Job | JobRequest) -> Decimal:
    """$/h of the job's (or job request's) cluster from its catalogue: the PS plus its workers (0 for a local cluster
    of no types)."""
    from recommender.models import InstanceType

    prices = dict(
        InstanceType.objects.filter(catalog__name=job.catalog, name__in=[job.ps_type, job.worker_type]).values_list(
            "name", "hourly_price"
        )
    )
    worker_price = prices.get(job.worker_type, Decimal(0))
    ps_price = prices.get(job.ps_type, Decimal(0)) if job.strategy == Job.Strategy.PS else Decimal(0)
    return ps_price + job.workers * worker_price


def recommend_request(job: Job | JobRequest) -> RecommendRequest:
    """What the recommender is asked for a job (or a job request): its workers is the limit when it has no budget."""
    return RecommendRequest(
        algorithm=job.algorithm,
        workload=job.workload,
        budget=float(job.hourly_budget) if job.hourly_budget is not None else None,
        max_workers=None if job.hourly_budget is not None else job.workers,
        ps_type=job.ps_type or None,
        worker_types=tuple(job.worker_types),
        worker_type=job.worker_type or None,
        parameter_server=job.strategy == Job.Strategy.PS,
    )


def _recommend(job: Job) -> None:
    """Ask the recommender for the cluster and take its answer."""
    from recommender import service

    answer = service.recommend(recommend_request(job), job.catalog)
    if job.provider == "local" and answer.workers > local.MAX_WORKERS:
        raise ValueError(f"the recommended {answer.workers} workers exceed the local provider's {local.MAX_WORKERS}")
    Job.objects.filter(pk=job.pk).update(
        ps_type=answer.ps_type or "",
        worker_type=answer.worker_type,
        workers=answer.workers,
        recommendation=service.as_dict(answer),
    )
    job.refresh_from_db()
    job.log(f"recommendation: {answer.explanation}")


def cluster_name(job: Job) -> str:
    """The job's cluster name, made once: the job id for people, a random part so that another installation on the
    same machine (another checkout, `make test` beside `make run`) never has a cluster of the same name."""
    if not job.cluster_name:
        Job.objects.filter(pk=job.pk, cluster_name="").update(cluster_name=f"fc2-{job.pk}-{secrets.token_hex(4)}")
        job.cluster_name = Job.objects.values_list("cluster_name", flat=True).get(pk=job.pk)
    return job.cluster_name


def provision(job_id: int, **_) -> bool:
    job = _job(job_id)
    if not job.transition(State.PROFILING, State.PROVISIONING, f"launching the cluster on {job.provider}"):
        return False
    spec = ClusterSpec(
        cluster_id=cluster_name(job),
        provider=job.provider,
        strategy=job.strategy,
        workers=job.workers,
        ps_type=job.ps_type,
        worker_type=job.worker_type,
        region=job.region,
    )
    cluster = provisioner.launch(spec)
    if not Job.objects.filter(pk=job.pk, state=State.PROVISIONING).update(cluster=cluster.to_dict()):
        provisioner.teardown(cluster)  # cancelled while launching
        return False
    Node.objects.bulk_create(
        [
            Node(job=job, name=n.name, role=n.role, index=n.index, instance_type=n.instance_type, address=n.address)
            for n in cluster.nodes
        ],
        ignore_conflicts=True,
    )
    job.log("nodes: " + ", ".join(f"{n.name} at {n.address}" for n in cluster.nodes))
    return True


def bootstrap(job_id: int, report_url: str | None = None, **_) -> bool:
    job = _job(job_id)
    if not job.transition(State.PROVISIONING, State.BOOTSTRAPPING, "installing the bundle and starting the nodes"):
        return False
    token = job.issue_token()
    Job.objects.filter(pk=job.pk, state=State.BOOTSTRAPPING).update(token_hash=job.token_hash)
    run = RunSpec(
        job_id=job.pk,
        wheel_path=job.bundle.wheel.path,
        main_module=job.bundle.main_module,
        args=tuple(f"--{key}={value}" for key, value in job.parameters.items()),
        dataset=job.dataset.path,
        report_url=report_url or settings.FC2_PUBLIC_URL,
        token=token,
    )
    cluster = provisioner.start(_cluster(job), run)
    saved = Job.objects.filter(pk=job.pk, state=State.BOOTSTRAPPING).update(cluster=cluster.to_dict())
    if saved and job.transition(State.BOOTSTRAPPING, State.RUNNING, f"{len(cluster.nodes)} nodes started"):
        return True
    job.refresh_from_db()
    if job.is_terminal:  # cancelled or failed while starting: stop what was started
        provisioner.teardown(cluster)
    return False


def watch(job_id: int, **_) -> bool:
    """One look at a running job: True while it should be looked at again."""
    job = _job(job_id)
    if job.state != State.RUNNING:
        return False
    if job.started_at and timezone.now() - job.started_at > timedelta(seconds=settings.FC2_JOB_TIMEOUT_S):
        fail(job, f"timed out after {settings.FC2_JOB_TIMEOUT_S} s")
        return False
    alive = provisioner.alive(_cluster(job))
    finished = {Node.Status.SUCCEEDED, Node.Status.FAILED}
    for node in job.nodes.all():
        if not alive.get(node.name, False) and node.status not in finished:
            job.refresh_from_db()
            if job.state != State.RUNNING:  # its completion report arrived meanwhile
                return False
            fail(job, f"{node.name} stopped without reporting a result{_tail(job, node.name)}")
            return False
    return True


def _tail(job: Job, node_name: str) -> str:
    cluster = _cluster(job)
    log = provisioner.fetch_logs(cluster).get(node_name, "") if cluster else ""
    return f"; its log ends:\n{log[-LOG_TAIL_CHARS:]}" if log.strip() else ""


def complete(job: Job) -> bool:
    """The chief reported success: collect the results (the completion report moves the job on, FC² §6)."""
    if not job.transition((State.BOOTSTRAPPING, State.RUNNING), State.COLLECTING, "the chief finished training"):
        return False
    enqueue(job, "collect")
    return True


def collect(job_id: int, **_) -> bool:
    job = _job(job_id)
    if job.state != State.COLLECTING:
        return False
    release(job_id)
    return job.transition(State.COLLECTING, State.SUCCEEDED, "results stored")


def fail(job: Job, reason: str, *, release_now: bool = True) -> bool:
    """Fail the job and release its cluster — now, or (when the report of a node of that very cluster is what
    failed it) in a step of its own, so the request never waits on the node it is tearing down."""
    if not job.transition(ACTIVE, State.FAILED, reason[:2000], failure_reason=reason):
        return False
    if release_now:
        release(job.pk)
    else:
        enqueue(job, "release")
    return True


def cancel(job: Job, by: str) -> bool:
    """Cancel at any state; the cluster, if any, is torn down before this returns."""
    if not job.transition(ACTIVE, State.CANCELLED, f"cancelled by {by}"):
        return False
    release(job.pk)
    return True


def release(job_id: int, **_) -> bool:
    """Keep the nodes' logs as artifacts and tear the cluster down — once, whoever asks first."""
    job = _job(job_id)
    if job.cluster is None or not Job.objects.filter(pk=job.pk, cluster__isnull=False).update(cluster=None):
        return False
    cluster = ClusterInfo.from_dict(job.cluster)
    try:
        nodes = {node.name: node for node in job.nodes.all()}
        for name, log in provisioner.fetch_logs(cluster).items():
            store_artifact(job, f"logs/{name}.log", log.encode(), node=nodes.get(name))
        provisioner.teardown(cluster)
    except Exception:
        Job.objects.filter(pk=job.pk).update(cluster=job.cluster)  # keep what a retry needs to find the nodes
        raise
    job.nodes.exclude(status__in=[Node.Status.SUCCEEDED, Node.Status.FAILED]).update(status=Node.Status.STOPPED)
    job.log(f"cluster {cluster.cluster_id} torn down")
    return True


def store_artifact(job: Job, name: str, data: bytes, node: Node | None = None) -> Artifact:
    from django.core.files.base import ContentFile

    with transaction.atomic():
        for old in Artifact.objects.filter(job=job, name=name):
            old.file.delete(save=False)
            old.delete()
        artifact = Artifact(job=job, node=node, name=name, size_bytes=len(data))
        artifact.file.save(name.rsplit("/", 1)[-1], ContentFile(data), save=False)
        artifact.save()
    return artifact


def chief_names(job: Job) -> set[str]:
    return {n.name for n in job.nodes.all() if is_chief(job.strategy, n.role, n.index)}


STEPS = {
    "profile": profile,
    "provision": provision,
    "bootstrap": bootstrap,
    "watch": watch,
    "collect": collect,
    "release": release,
}
NEXT = {"profile": "provision", "provision": "bootstrap", "bootstrap": "watch", "watch": "watch"}


def advance(step: str, job_id: int) -> None:
    """Run one step for a Celery-driven job and queue the next; a failing step fails the job."""
    try:
        ok = STEPS[step](job_id)
    except Exception as exc:
        logger.exception("job %s: step %s failed", job_id, step)
        fail(_job(job_id), f"{step} failed: {exc}")
        return
    if ok and step in NEXT:
        enqueue(_job(job_id), NEXT[step], countdown=settings.FC2_WATCH_INTERVAL_S if NEXT[step] == "watch" else None)


def enqueue(job: Job, step: str, countdown: float | None = None) -> None:
    """Send `step` to the Celery worker once the current transaction commits; inline jobs drive themselves."""
    if job.driver != Job.Driver.CELERY:
        return
    from fc2.celery import app

    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    transaction.on_commit(lambda: app.send_task(f"fc2.tasks.{step}", args=[job.pk], countdown=countdown, queue=queue))


def run_inline(job_id: int, poll_s: float = 0.5) -> Job:
    """Drive a job to its end in this process, serving the report API on a private port meanwhile."""
    with report_server() as url:
        try:
            for step in ("profile", "provision", "bootstrap"):
                try:
                    if not STEPS[step](job_id, report_url=url):
                        break
                except Exception as exc:
                    logger.exception("job %s: step %s failed", job_id, step)
                    fail(_job(job_id), f"{step} failed: {exc}")
                    break
            while not (job := _job(job_id)).is_terminal:
                if job.state == State.COLLECTING:
                    collect(job_id)
                elif job.state == State.RUNNING:
                    watch(job_id)
                time.sleep(poll_s)
            release(job_id)  # a job failed by a node's report leaves its cluster for us to release
        except BaseException:
            cancel(_job(job_id), "interrupt")  # Ctrl-C or a crash here must not leave a cluster behind
            raise
    return _job(job_id)


@contextmanager
def report_server():
    """The platform's WSGI app on a free 127.0.0.1 port in a background thread; yields its base URL."""
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), QuietHandler, allow_reuse_address=False)
    server.set_app(get_wsgi_application())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
