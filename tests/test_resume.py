"""Managed jobs' resume after a lost node (issue 45 §2): the restart as the pipeline records it — the work lost since
the last checkpoint, the report token revoked, the restarts counted and, once spent, the job failed naming the node —
and, for real, a worker lost mid-training on the lab (its host destroyed, its link down) and on aws (moto's EC2, its
instances lab hosts: a spot instance taken back, an on-demand one or the parameter server's terminated): its cluster
made again, every node started again from the checkpoint its chief shipped, the job succeeding, nothing left behind
— or, without a restart, failing naming the node; a node lost while bootstrapping replaced, a cancel during the
restart, and on aws a restart made again after its bootstrap was lost, reusing the instances it launched.

The heavy cases in training drive the job with a real Celery worker and the sweep run here every half second, as
tests/test_node_loss.py does (its helpers): a node silent for 3 s is looked at over SSH, one that does not answer for
10 s is lost. Their code is CHECKPOINTER below: a trainer under the checkpoint contract.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import pytest
from django.utils import timezone

import provisioner
from fc2.models import Artifact, Job, Node
from fc2.services import artifacts, checkpoints, jobs, pipeline
from fc2.services.bundles import store_bundle
from harness.ec2lab import NOTHING, REGION, ec2, everything_tagged, live_instances
from harness.wheels import GOOD, make_wheel
from monitor.models import LossPoint
from provisioner import ClusterInfo, lab
from recommender.catalog import load_catalog
from tests import test_node_loss as losses
from tests.conftest import aws_worker_env, lab_leftovers, make_job, nothing_left, wait_for
from tests.test_spot import RunInstances

State = Job.State


def running(job: Job, **fields) -> Job:
    """`job` as if training for 100 s at $3.6/h on a mirrored pair, worker-0 its chief."""
    started = timezone.now() - timedelta(seconds=100)
    Job.objects.filter(pk=job.pk).update(
        state=State.RUNNING, strategy="mirrored", workers=2, hourly_cost=3.6, started_at=started,
        launched_at=started, token_hash="f" * 64, steps=100, **fields,
    )  # fmt: skip
    for index in range(2):
        Node.objects.create(job=job, name=f"worker-{index}", role="worker", index=index, status=Node.Status.RUNNING)
    job.refresh_from_db()
    return job


def progress(job: Job, step: int, seconds_ago: float, epoch: int = 1) -> None:
    chief = job.nodes.get(name="worker-0")
    LossPoint.objects.create(
        node=chief, at=timezone.now() - timedelta(seconds=seconds_ago), epoch=epoch, step=step, loss=1
    )


@pytest.mark.django_db
def test_a_lost_node_with_a_restart_left_records_the_work_lost_since_the_checkpoint_and_relaunches(job):
    job = running(job, max_restarts=2)
    checkpoint = artifacts.store_artifact(job, "checkpoints/3.tar.gz", b"archive")
    Artifact.objects.filter(pk=checkpoint.pk).update(created_at=timezone.now() - timedelta(seconds=30))
    progress(job, 40, seconds_ago=60)
    progress(job, 70, seconds_ago=31)  # the step the checkpoint was taken at
    progress(job, 90, seconds_ago=2, epoch=1)
    progress(job, 105, seconds_ago=1, epoch=2)  # steps count the whole run, across epochs (100 steps an epoch)

    assert pipeline.node_lost(job, ["worker-1"], "worker-1 is lost: its host is gone")

    job.refresh_from_db()
    assert job.state == State.PROVISIONING and job.token_hash == ""  # the old nodes' reports are refused now
    (restart,) = job.restarts
    assert restart["nodes"] == ["worker-1"] and restart["reason"] == "worker-1 is lost: its host is gone"
    assert restart["checkpoint"] == "3.tar.gz" and restart["resumed_at"] is None
    assert restart["lost_steps"] == 105 - 70
    assert 30 <= restart["lost_s"] < 40 and restart["lost_dollars"] == pytest.approx(restart["lost_s"] / 1000, 0.01)
    assert set(job.nodes.values_list("status", flat=True)) == {Node.Status.PENDING}
    said = job.events.order_by("-pk").first().message
    assert said.startswith("restart 1 of 2: worker-1 is lost") and "checkpoint 3.tar.gz: 35 steps, 3" in said
    assert pipeline.restarting(job) == restart
    assert pipeline.run_spec(job).restore_from == checkpoint.file.path  # what every node restores from


@pytest.mark.django_db
def test_without_a_checkpoint_the_whole_run_is_lost_and_resumed_from_the_start(job):
    job = running(job, max_restarts=1)
    progress(job, 20, seconds_ago=50)
    progress(job, 60, seconds_ago=5)
    assert pipeline.node_lost(job, ["worker-0", "worker-1"], "both lost")
    job.refresh_from_db()
    (restart,) = job.restarts
    assert restart["checkpoint"] == "" and restart["lost_steps"] == 40  # from its first progress line
    assert 100 <= restart["lost_s"] < 110
    assert pipeline.run_spec(job).restore_from == ""


@pytest.mark.django_db
def test_restarts_spent_or_none_asked_fail_the_job_naming_the_node_as_before(job, bob, bundle, digits):
    restart = {"at": "2026-11-29T04:31:02+00:00", "nodes": ["worker-1"], "resumed_at": "2026-11-29T04:31:20+00:00"}
    job = running(job, max_restarts=1, restarts=[restart])
    assert pipeline.node_lost(job, ["worker-1"], "worker-1 is lost: its host is gone") is False
    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.failure_reason == "worker-1 is lost: its host is gone; restarts made: 1 of 1 (1: worker-1 at 04:31:02)"

    other = running(make_job(bob, bundle, digits))  # max_restarts 0: exactly today's failure
    pipeline.node_lost(other, ["worker-1"], "worker-1 is lost: its host is gone")
    other.refresh_from_db()
    assert other.state == State.FAILED and other.failure_reason == "worker-1 is lost: its host is gone"
    assert other.restarts == []


@pytest.mark.django_db
def test_a_resume_keeps_the_runs_start_so_its_time_limit_and_cost_count_from_the_first(job):
    job = running(job, max_restarts=1)
    started = job.started_at
    pipeline.node_lost(job, ["worker-1"], "lost")
    job.refresh_from_db()
    job.transition(State.PROVISIONING, State.BOOTSTRAPPING)
    # What bootstrap writes once the nodes are started again (without a cluster to start here)
    restart = {**pipeline.restarting(job), "resumed_at": timezone.now().isoformat()}
    assert job.transition(State.BOOTSTRAPPING, State.RUNNING, "again", restarts=[restart], started_at=started)
    job.refresh_from_db()
    assert job.started_at == started and pipeline.restarting(job) is None
    assert pipeline.training_began(job) > started  # the next loss counts its lost work from the resume


# --- on the lab and on aws, for real ----------------------------------------------------------------------------


lab_missing = provisioner.unavailable("lab")


@pytest.fixture
def workers_losing(settings, workers):
    """Real workers with the node-loss cases' timings (tests/test_node_loss.py)."""
    settings.FC2_NODE_SILENCE_S = losses.SILENCE_S
    settings.FC2_NODE_LOST_S = settings.FC2_NODE_UNREACHABLE_S = losses.LOST_S
    workers.env["FC2_WORKERS_FINISH_S"] = "5"
    return workers


# A trainer as a bundle under the checkpoint contract writes it (examples/README.md): a step every half second, each
# only while every other node answers on its TensorFlow port (as all-reduce stalls on a lost peer, and a chief on a
# lost parameter server), its chief checkpointing every CHECKPOINT_EVERY steps in TensorFlow's layout to
# $FC2_CHECKPOINT_DIR and restoring from $FC2_RESTORE_FROM when given; a parameter server serves until stopped, and a
# worker whose steps are done until its chief has finished (as TensorFlow's workers end with their chief: one that
# started a moment sooner must not leave its chief stalled on it for good).
CHECKPOINTER = b"""
import json, os, pathlib, re, socket, sys, threading, time
arg = lambda name, default: next((a.split("=", 1)[1] for a in sys.argv if a.startswith(f"--{name}=")), default)
seconds, every = float(arg("seconds", "60")), int(arg("checkpoint_every", "6"))
chief = os.environ.get("FC2_IS_CHIEF") == "1"
config = json.loads(os.environ["TF_CONFIG"])
addresses = [address for kind in config["cluster"].values() for address in kind]
mine = config["cluster"][config["task"]["type"]][config["task"]["index"]]
server = socket.create_server(("0.0.0.0", int(mine.rsplit(":", 1)[1])))
threading.Thread(target=lambda: [server.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
while config["task"]["type"] == "ps":
    time.sleep(1)

def answers(address):
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=0.3).close()
    except OSError:
        return False
    return True

def peers_answer():
    return all(answers(address) for address in addresses)

steps, start = int(seconds * 2), 0
if os.environ.get("FC2_RESTORE_FROM"):
    index = (pathlib.Path(os.environ["FC2_RESTORE_FROM"]) / "checkpoint").read_text()
    start = int(re.search(r"ckpt-([0-9]+)", index).group(1))
    print(f"restored at step {start}", flush=True)
checkpoints = pathlib.Path(os.environ.get("FC2_CHECKPOINT_DIR") or "checkpoints")
checkpoints.mkdir(parents=True, exist_ok=True)
for step in range(start + 1, steps + 1):
    while not peers_answer():
        time.sleep(0.5)
    time.sleep(0.5)
    if chief:
        print("FC2_PROGRESS " + json.dumps({"epoch": 1, "step": step, "steps": steps, "loss": 1 / step}), flush=True)
        if step % every == 0:
            (checkpoints / f"ckpt-{step}.index").write_text(str(step))
            (checkpoints / "checkpoint.partial").write_text(f'model_checkpoint_path: "ckpt-{step}"')
            (checkpoints / "checkpoint.partial").replace(checkpoints / "checkpoint")
if chief:
    (pathlib.Path(os.environ["FC2_OUTPUT_DIR"]) / "metrics.json").write_text(json.dumps({"steps": steps}))
else:
    while answers((config["cluster"].get("chief") or config["cluster"]["worker"])[0]):
        time.sleep(0.5)
print("done", flush=True)
"""
CHECKPOINT_EVERY = 6  # steps: a checkpoint every 3 s
TRAIN_S = 14  # 28 steps: the loss comes near step 8 (2 past the first checkpoint shipped), well before the end
RESUMED_WITHIN_S = 60  # from the loss to the nodes started again (benchmarks/resume.py measures it)
LAB_FAULTS = {"host gone": losses.host_gone, "link down": losses.link_down}


def checkpointer_request(
    owner, dataset, tmp_path, code: bytes = CHECKPOINTER, seconds: float = TRAIN_S, **resources
) -> jobs.JobRequest:
    """A job of the checkpointing trainer (or `code`) training `seconds`, by default on 2 mirrored workers."""
    with make_wheel(tmp_path, {**GOOD, "demo/main.py": code}).open("rb") as wheel:
        bundle = store_bundle(owner, wheel, "demo-1.0-py3-none-any.whl")
    parameters = {"seconds": str(seconds), "checkpoint_every": str(CHECKPOINT_EVERY)}
    cluster = {"strategy": "mirrored", "workers": 2, **resources}
    return jobs.JobRequest(bundle=bundle, dataset=dataset, parameters=parameters, **cluster)


def submit_checkpointer(owner, dataset, tmp_path, **resources) -> Job:
    """A job of the checkpointing trainer, to the workers."""
    return jobs.submit(owner, checkpointer_request(owner, dataset, tmp_path, **resources), driver=Job.Driver.CELERY)


def chief_step(job: Job) -> int:
    """The chief's last step reported."""
    chief = pipeline.chief_names(Job.objects.get(pk=job.pk))  # (as planned: a job's strategy is its plan's)
    point = LossPoint.objects.filter(node__job=job, node__name__in=chief).order_by("-at", "-pk").first()
    return point.step if point else 0


def checkpointed_and_killed(job: Job, fault, workers, victim: str = losses.VICTIM) -> tuple[ClusterInfo, datetime]:
    """Wait until the chief has shipped a checkpoint and trained on past it, then hit the victim: (the cluster, the
    moment)."""

    def past_a_checkpoint() -> bool:
        done = Job.objects.get(pk=job.pk).is_terminal
        return done or (checkpoints.latest(job) is not None and chief_step(job) % CHECKPOINT_EVERY >= 2)

    wait_for(past_a_checkpoint, "a checkpoint shipped", workers)
    job.refresh_from_db()
    assert job.state == State.RUNNING, (job.state, job.failure_reason, workers.logs())
    cluster = ClusterInfo.from_dict(job.cluster)
    fault(cluster, victim)
    return cluster, timezone.now()


def _resumed(job: Job, killed_at: datetime, within_s: float) -> tuple[Job, float]:
    job = losses.sweep_until(
        job, lambda j: j.is_terminal or bool(j.restarts and j.restarts[-1].get("resumed_at")), within_s
    )
    assert job.restarts and job.restarts[-1].get("resumed_at"), (job.state, job.failure_reason, job.restarts)
    resumed_s = (datetime.fromisoformat(job.restarts[-1]["resumed_at"]) - killed_at).total_seconds()
    assert resumed_s < within_s
    return job, resumed_s


@pytest.mark.heavy
@pytest.mark.skipif(bool(lab_missing), reason=str(lab_missing))
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fault", LAB_FAULTS)
def test_a_lab_worker_lost_mid_training_resumes_from_the_checkpoint_and_succeeds(
    fault, alice, digits, workers_losing, tmp_path
):
    load_catalog("lab")
    workers_losing.start()
    job = submit_checkpointer(alice, digits, tmp_path, provider="lab", worker_type="lab-w-100", max_restarts=1)
    cluster, killed_at = checkpointed_and_killed(job, LAB_FAULTS[fault], workers_losing)

    job, resumed_s = _resumed(job, killed_at, RESUMED_WITHIN_S + 15)
    (restart,) = job.restarts
    since_resume = LossPoint.objects.filter(node__job=job, at__gt=restart["resumed_at"])
    losses.sweep_until(job, lambda j: j.is_terminal or since_resume.exists(), 30)
    restored = min(p.step for p in since_resume) - 1  # the checkpoint's step: the chief goes on from it
    # The chief's steps done before the loss (it stalls with its peer gone) and done again after the resume
    lost_at_loss = max(p.step for p in LossPoint.objects.filter(node__job=job, at__lt=restart["at"])) - restored
    figure = {"fault": fault, "training_again_s": round(resumed_s, 1), "lost_steps_at_loss": lost_at_loss}
    figure |= {"checkpoint_every": CHECKPOINT_EVERY, "recorded": {k: restart[k] for k in ("lost_steps", "lost_s")}}
    print(f"\nFIGURE resume {json.dumps(figure)}")
    job = losses.sweep_until(job, lambda j: j.is_terminal, TRAIN_S + 180)  # generous: its time is the FIGURE lines'
    assert job.state == State.SUCCEEDED, (job.failure_reason, workers_losing.logs())
    assert restart["nodes"] == [losses.VICTIM] and restart["checkpoint"] and restored > 0  # not from the start
    assert 0 <= lost_at_loss <= CHECKPOINT_EVERY + 4  # one interval, and the steps its shipping took
    timeline = list(job.events.values_list("message", flat=True))
    assert any(m.startswith("restart 1 of 1: worker-1 is lost") for m in timeline)
    assert any(f"nodes started again from checkpoint {restart['checkpoint']}: restart 1 of 1" in m for m in timeline)
    assert job.cost_so_far > restart["lost_dollars"] > 0  # the lost work is in the job's cost
    losses.check_released(job, f"lab {fault} resumed")
    assert nothing_left(lab_leftovers(cluster.cluster_id, Path(cluster.workdir), lab.tag())) == {}


class AwsLoss(NamedTuple):
    """An aws node lost mid-run: its instance terminated (by EC2 taking a spot instance back, or anyone)."""

    strategy: str
    victim: str
    spot: bool = False
    max_restarts: int = 1


AWS_LOSSES = {
    "spot taken back": AwsLoss("mirrored", "worker-1", spot=True),
    "instance terminated": AwsLoss("mirrored", "worker-1"),
    "ps terminated": AwsLoss("ps", "ps-0"),  # the chief and the worker stall on it
    "chief terminated": AwsLoss("ps", "chief-0"),  # the node that shipped the checkpoint: restored on its new machine
    "no restarts": AwsLoss("mirrored", "worker-1", max_restarts=0),
}


@pytest.mark.heavy
@pytest.mark.skipif(bool(lab_missing), reason=str(lab_missing))
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case", AWS_LOSSES)
def test_an_aws_instance_lost_mid_run_is_relaunched_and_the_job_resumes_or_fails_naming_it(
    case, alice, digits, workers_losing, ec2_hosts, settings, tmp_path
):
    """Its instance terminated once the chief shipped a checkpoint: with a restart left, only its instance is
    launched again (the survivors kept), in the market asked, and every node resumes from the checkpoint until the
    job succeeds; with none, the job fails naming the node. Nothing is left either way."""
    loss = AWS_LOSSES[case]
    load_catalog("fc2-2018")
    workers_losing.start(**aws_worker_env(settings))
    job = submit_checkpointer(
        alice, digits, tmp_path, provider="aws", region=REGION, worker_type="c4.xlarge", strategy=loss.strategy,
        workers=1 if loss.strategy == "ps" else 2, max_restarts=loss.max_restarts, spot=loss.spot,
    )  # fmt: skip

    def terminate(cluster, name: str) -> None:
        ec2().terminate_instances(InstanceIds=[losses._node(cluster, name).instance_id])

    cluster, _ = checkpointed_and_killed(job, terminate, workers_losing, loss.victim)
    victim = losses._node(cluster, loss.victim)
    wait_for(lambda: victim.instance_id not in ec2_hosts.hosts, "host gone", workers_losing)
    killed_at = timezone.now()

    if not loss.max_restarts:
        job, ended_s = losses.check_ended(job, killed_at, State.FAILED, loss.victim, workers_losing)
        assert job.failure_reason.startswith(loss.victim) and "restarts made" not in job.failure_reason
        released_s = losses.check_released(job, f"aws {case}")
        print(f"\nFIGURE chaos {json.dumps({'case': f'aws {case}', 'failed_s': round(ended_s, 1)})}")
        print(f"FIGURE chaos {json.dumps({'case': f'aws {case}', 'released_after_s': round(released_s, 1)})}")
        assert everything_tagged(job.cluster_name) == NOTHING and live_instances() == []
        return

    job, resumed_s = _resumed(job, killed_at, RESUMED_WITHIN_S + 30)
    (restart,) = job.restarts
    seen_s = (datetime.fromisoformat(restart["at"]) - killed_at).total_seconds()
    now = {n.name: n for n in ClusterInfo.from_dict(job.cluster).nodes}
    assert now[loss.victim].instance_id != victim.instance_id  # a new instance in its place
    for survivor in (n for n in cluster.nodes if n.name != loss.victim):
        assert now[survivor.name].instance_id == survivor.instance_id  # kept: only the shortfall is made
    market = {"spot"} if loss.spot else {None}
    assert {i.get("InstanceLifecycle") for i in live_instances(job.cluster_name)} == market
    assert restart["nodes"] == [loss.victim] and restart["checkpoint"]  # from its shipped checkpoint
    if loss.spot:  # billed at the spot price, said on its timeline
        assert job.events.filter(message__startswith="spot prices: c4.xlarge spot $").exists()
        assert job.rates[-1]["market"] == "spot" and job.hourly_cost < 0.001
    job = losses.sweep_until(job, lambda j: j.is_terminal, TRAIN_S + 180)  # generous: its time is the FIGURE lines'
    timeline = list(job.events.order_by("at", "pk").values_list("at", "message"))
    nodes = [f"{n.name} {n.status} step {n.step} heard {n.last_report_at}" for n in job.nodes.order_by("name")]
    said = "\n".join([*(f"{at:%H:%M:%S.%f} {message[:300]}" for at, message in timeline[-12:]), *nodes])
    assert job.state == State.SUCCEEDED, f"{job.state} {job.failure_reason}\n{said}\n{workers_losing.logs()[-4000:]}"
    figure = {"case": f"aws {case}", "seen_s": round(seen_s, 1), "training_again_s": round(resumed_s, 1)}
    print(f"\nFIGURE chaos {json.dumps(figure)}")
    losses.check_released(job, f"aws {case} resumed")
    assert everything_tagged(job.cluster_name) == NOTHING and live_instances() == []


@pytest.mark.heavy
@pytest.mark.skipif(bool(lab_missing), reason=str(lab_missing))
@pytest.mark.django_db(transaction=True)
def test_a_node_lost_while_bootstrapping_is_replaced_and_a_cancel_during_the_restart_leaves_nothing(
    alice, digits, monkeypatch, tmp_path
):
    """The steps run here, one by one, as the inline driver runs them: a host destroyed between the launch and the
    bootstrap fails the bootstrap on it, which has its cluster made again rather than the job failed; the job
    cancelled while it is, its cluster is torn down by the step that made it."""
    from provisioner import nodes

    monkeypatch.setattr(nodes, "READY_TIMEOUT_S", 5)  # how long the bootstrap waits for a machine to answer
    load_catalog("lab")
    with make_wheel(tmp_path, {**GOOD, "demo/main.py": CHECKPOINTER}).open("rb") as wheel:
        bundle = store_bundle(alice, wheel, "demo-1.0-py3-none-any.whl")
    request = jobs.JobRequest(
        bundle=bundle, dataset=digits, strategy="mirrored", workers=2, parameters={"seconds": "60"},
        provider="lab", worker_type="lab-w-100", max_restarts=2,
    )  # fmt: skip
    job = jobs.submit(alice, request, driver=Job.Driver.INLINE)
    assert pipeline.run_step("recommend", job.pk) and pipeline.run_step("provision", job.pk)
    job.refresh_from_db()
    first = ClusterInfo.from_dict(job.cluster)
    losses.host_gone(first, losses.VICTIM)

    assert not pipeline.run_step("bootstrap", job.pk, report_url="http://127.0.0.1:9")
    job.refresh_from_db()
    assert job.state == State.PROVISIONING and job.restarts[0]["nodes"] == [losses.VICTIM]
    assert job.restarts[0]["state"] == State.BOOTSTRAPPING and job.restarts[0]["lost_s"] == 0
    assert pipeline.run_step("provision", job.pk, resume=True)
    assert pipeline.run_step("bootstrap", job.pk, report_url="http://127.0.0.1:9")
    job.refresh_from_db()
    assert job.state == State.RUNNING and job.restarts[0]["resumed_at"]
    assert provisioner.answering(ClusterInfo.from_dict(job.cluster)) == {"worker-0": True, "worker-1": True}

    # Lost again, and cancelled while its cluster is made again
    assert pipeline.node_lost(job, [losses.VICTIM], "worker-1 is lost")
    assert pipeline.cancel(Job.objects.get(pk=job.pk), "alice")
    assert not pipeline.run_step("provision", job.pk, resume=True)  # the cancel won: nothing more is made
    assert pipeline.release(job.pk)
    job.refresh_from_db()
    assert job.state == State.CANCELLED and job.cluster is None
    assert nothing_left(lab_leftovers(first.cluster_id, Path(first.workdir), lab.tag())) == {}


@pytest.mark.heavy
@pytest.mark.skipif(bool(lab_missing), reason=str(lab_missing))
@pytest.mark.django_db(transaction=True)
def test_an_aws_restart_made_again_after_its_bootstrap_was_lost_keeps_the_instances_it_launched(
    alice, digits, ec2_hosts, monkeypatch, settings, tmp_path
):
    """An instance terminated mid-run (not spot) is relaunched; the worker starting the restart's nodes is lost
    (its lease expires mid-bootstrap, the nodes started): the restart made again from its provision keeps the
    instances its first relaunch made — nothing launched or terminated — stops what the lost bootstrap started, and
    its bootstrap starts the same machines again. Cancelled, nothing is left."""
    load_catalog("fc2-2018")
    request = checkpointer_request(
        alice, digits, tmp_path, seconds=120, provider="aws", region=REGION, worker_type="c4.xlarge", max_restarts=1
    )
    job = jobs.submit(alice, request, driver=Job.Driver.INLINE)
    assert pipeline.run_step("recommend", job.pk) and pipeline.run_step("provision", job.pk)
    assert pipeline.run_step("bootstrap", job.pk)
    job.refresh_from_db()
    victim = losses._node(ClusterInfo.from_dict(job.cluster), losses.VICTIM)
    ec2().terminate_instances(InstanceIds=[victim.instance_id])
    deadline = time.monotonic() + 30
    while victim.instance_id in ec2_hosts.hosts:  # its host goes with it
        assert time.monotonic() < deadline, "the terminated instance's host is still there"
        time.sleep(0.2)
    assert pipeline.node_lost(job, [losses.VICTIM], "worker-1 is lost: its instance was terminated")
    assert pipeline.run_step("provision", job.pk, resume=True)
    job.refresh_from_db()
    relaunched = ClusterInfo.from_dict(job.cluster)
    assert losses._node(relaunched, losses.VICTIM).instance_id != victim.instance_id

    # Its bootstrap starts the nodes, and its worker is lost before it records them
    assert job.transition(State.PROVISIONING, State.BOOTSTRAPPING, "installing the bundle and starting the nodes")
    run = replace(pipeline.run_spec(job), report_url=settings.FC2_PUBLIC_URL, token="held-by-the-lost-worker")
    started_by_the_lost = provisioner.bootstrap(relaunched, run)
    assert all(provisioner.alive(started_by_the_lost).values())
    # What the sweep does once the lost worker's lease expired (tests/test_chaos.py), the provision it sends run here
    assert pipeline.restart_again(Job.objects.get(pk=job.pk), "the worker running bootstrap was lost")
    job.refresh_from_db()
    assert job.state == State.PROVISIONING and job.restarts[0]["redone_at"]

    calls = RunInstances(monkeypatch)
    started = time.monotonic()
    assert pipeline.run_step("provision", job.pk, resume=True)
    redo_s = time.monotonic() - started
    job.refresh_from_db()
    again = ClusterInfo.from_dict(job.cluster)
    assert "run_instances" not in calls.operations and "terminate_instances" not in calls.operations
    assert [n.instance_id for n in again.nodes] == [n.instance_id for n in relaunched.nodes]
    assert not any(provisioner.alive(started_by_the_lost).values())  # what the lost bootstrap started is stopped
    assert len(job.restarts) == 1  # no restart counted: no node was lost
    assert pipeline.run_step("bootstrap", job.pk)
    job.refresh_from_db()
    assert job.state == State.RUNNING and job.restarts[0]["resumed_at"]
    print(f"\nFIGURE redo {json.dumps({'relaunch_redone_s': round(redo_s, 1), 'launched': 0})}")

    assert pipeline.cancel(job, "alice") and pipeline.release(job.pk)
    assert everything_tagged(job.cluster_name) == NOTHING and live_instances() == []
