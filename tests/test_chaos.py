"""Managed jobs' nodes lost at moments the resume's own tests (tests/test_resume.py) do not choose: a peer's failure
that a lost node caused, a second loss once the restarts are spent, the platform's worker lost while a restart starts
its nodes, a node lost once the chief has succeeded (collecting, and the release tearing the cluster down). Each ends
in a clear state — resumed, succeeded, or failed naming the nodes and the restarts — with nothing left.

The light cases drive the pipeline's functions on the database; the lab case runs a job for real, driven inline (the
steps in a thread here, the report API served by it), its code a trainer that fails, as TensorFlow's collectives do,
once a peer it trained with stops answering.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

import provisioner
from fc2.models import Job, Node
from fc2.services import artifacts, checkpoints, inline, jobs, pipeline, reports, sweep
from provisioner import ClusterInfo, NodeError, lab
from recommender.catalog import load_catalog
from tests import test_node_loss as losses
from tests.conftest import lab_leftovers, make_job, nothing_left
from tests.test_resume import CHECKPOINT_EVERY, CHECKPOINTER, TRAIN_S, checkpointer_request, chief_step, running

State = Job.State


def failed(job: Job, name: str) -> Node:
    node = job.nodes.get(name=name)
    Node.objects.filter(pk=node.pk).update(status=Node.Status.FAILED, exit_code=1, log_tail="UnavailableError")
    node.refresh_from_db()
    return node


@pytest.mark.django_db
@pytest.mark.parametrize("max_restarts", [0, 1])
def test_a_failed_nodes_report_waits_for_its_cluster_to_be_looked_at_only_with_restarts_left(job, max_restarts):
    """The report of a node that failed, as it arrives: a job without restarts fails at once, as always; a managed
    one stays running until its driver has looked for a lost node (check_running), said once on its timeline."""
    job = running(job, max_restarts=max_restarts)
    moved = reports.move_on(job, failed(job, "worker-0"))
    job.refresh_from_db()
    if max_restarts:
        assert not moved and job.state == State.RUNNING
        assert job.events.filter(message="worker-0 failed with exit code 1: its cluster is looked at for a lost node "
                                 "first (restarts left)").exists()  # fmt: skip
    else:
        assert moved and job.state == State.FAILED
        assert job.failure_reason == "worker-0 failed with exit code 1; its log ends:\nUnavailableError"


@pytest.mark.django_db
def test_a_node_failing_once_its_chief_has_succeeded_fails_nothing(job):
    """Collecting: the chief's results are stored, so a worker that fails after it (its peer gone) leaves the job to
    succeed."""
    job = running(job)
    Job.objects.filter(pk=job.pk).update(state=State.COLLECTING)
    job.refresh_from_db()
    assert not reports.move_on(job, failed(job, "worker-1"))
    assert job.events.filter(message__startswith="worker-1 failed with exit code 1 after the chief succeeded").exists()
    assert pipeline.collect(job.pk)
    assert Job.objects.get(pk=job.pk).state == State.SUCCEEDED


@pytest.mark.django_db
def test_restarts_spent_fail_the_job_naming_every_restart_and_its_nodes(job):
    job = running(job, max_restarts=2)
    assert pipeline.node_lost(job, ["worker-1"], "worker-1 is lost")
    restarted = {"resumed_at": timezone.now().isoformat()}
    Job.objects.filter(pk=job.pk).update(state=State.RUNNING, restarts=[{**job.restarts[0], **restarted}])
    assert pipeline.node_lost(job, ["worker-0", "worker-1"], "worker-0 is lost")
    Job.objects.filter(pk=job.pk).update(state=State.RUNNING)
    assert not pipeline.node_lost(job, ["worker-1"], "worker-1 is lost: its host is gone")
    job.refresh_from_db()
    first, second = (datetime.fromisoformat(r["at"]).strftime("%H:%M:%S") for r in job.restarts)
    assert job.state == State.FAILED
    assert job.failure_reason == (
        f"worker-1 is lost: its host is gone; restarts made: 2 of 2 (1: worker-1 at {first}; 2: worker-0, worker-1 "
        f"at {second})"
    )


@pytest.mark.django_db
def test_a_node_lost_while_a_restart_is_provisioned_with_none_left_fails_naming_the_restarts(job):
    """A second loss while the last restart's cluster is made: the job fails as one lost in training does, naming
    the restarts made — not as a provision that failed for a reason of its own."""
    job = running(job, max_restarts=1)
    assert pipeline.node_lost(job, ["worker-1"], "worker-1 is lost")
    job.refresh_from_db()
    error = NodeError("worker-0", "SSH: connection refused")
    lost = pipeline._lost_nodes("provision", job, error)
    assert lost == []  # its launch failed on a node before any was recorded
    assert not pipeline.node_lost(job, lost, f"provision failed: {error}")
    job.refresh_from_db()
    assert job.state == State.FAILED and "; restarts made: 1 of 1 (1: worker-1 at " in job.failure_reason
    assert pipeline._lost_nodes("provision", running(make_job(job.owner, job.bundle, job.dataset)), error) is None


@pytest.mark.django_db
def test_a_restarts_bootstrap_whose_worker_was_lost_is_made_again_not_failed(job, settings):
    """The worker starting a restart's nodes died (its lease expired): the restart is made again from its provision —
    the nodes that lost bootstrap may have started settled or replaced (provisioner.relaunch), the token they hold
    revoked — without counting another restart. Bootstrap lost outside a restart still fails the job."""
    job = running(job, max_restarts=1)
    assert pipeline.node_lost(job, ["worker-1"], "worker-1 is lost")
    job.refresh_from_db()
    relaunched = {**job.restarts[0], "relaunched_at": timezone.now().isoformat()}
    expired = timezone.now() - timedelta(seconds=1)
    Job.objects.filter(pk=job.pk).update(
        state=State.BOOTSTRAPPING, restarts=[relaunched], token_hash="e" * 64, lease_until=expired
    )
    sweep.reconcile(Job.objects.get(pk=job.pk), pipeline.Lease.take(job.pk, expired))
    job.refresh_from_db()
    assert job.state == State.PROVISIONING and job.token_hash == ""
    (restart,) = job.restarts
    assert "relaunched_at" not in restart and restart["resumed_at"] is None  # relaunched again, the same restart
    assert restart["redone_at"]  # its first relaunch's instances kept where they answer (provisioner.relaunch)
    assert job.events.filter(message__startswith="the worker running bootstrap was lost: restart 1 of 1 made").exists()

    Job.objects.filter(pk=job.pk).update(state=State.BOOTSTRAPPING, restarts=[], lease_until=expired)
    sweep.reconcile(Job.objects.get(pk=job.pk), pipeline.Lease.take(job.pk, expired))
    job.refresh_from_db()
    assert job.state == State.FAILED and job.failure_reason == "the worker running bootstrap was lost"


@pytest.mark.django_db
def test_a_spot_interruption_notice_restarts_the_job_once_its_checkpoint_is_shipped(job):
    """The notice (its line on the timeline, as ingestion writes it) has the chief checkpoint at once; once that
    checkpoint is shipped the job restarts from it, before the machine is taken back and seen lost."""
    job = running(job, max_restarts=1)
    cluster = ClusterInfo(job.cluster_name or "fc2-test", "lab", "mirrored", nodes=())
    Job.objects.filter(pk=job.pk).update(cluster=cluster.to_dict())
    job.nodes.update(last_report_at=timezone.now())  # every node reporting: none is looked at on its machine
    job.log(checkpoints.interruption_line("worker-1", "terminate", "2026-11-29T04:22:00Z"))
    job.log("worker-0: checkpoint x: interruption notice (terminate) not shipped")  # a name its code chose: no notice
    sweep.check_running(Job.objects.get(pk=job.pk))
    assert Job.objects.get(pk=job.pk).state == State.RUNNING  # the checkpoint it asked for is not shipped yet

    artifacts.store_artifact(job, "checkpoints/000001.tar.gz", b"archive")
    sweep.check_running(Job.objects.get(pk=job.pk))
    job.refresh_from_db()
    assert job.state == State.PROVISIONING
    (restart,) = job.restarts
    assert restart["nodes"] == ["worker-1"] and restart["checkpoint"] == "000001.tar.gz"
    assert restart["reason"].startswith("worker-1 got a spot interruption notice: its cluster made again before")


# --- on the lab, for real ------------------------------------------------------------------------------------------

lab_missing = provisioner.unavailable("lab")

# CHECKPOINTER, but failing as TensorFlow's collectives do once a peer it has trained with stops answering, rather
# than waiting for it: the job's failure reaches the platform (the survivor's report) before the loss is seen.
PEER_FAILS = CHECKPOINTER.replace(
    b"    while not peers_answer():\n",
    b"    while not peers_answer():\n"
    b"        if step > start + 1:\n"
    b"            sys.exit('UnavailableError: peer gone')\n",
)
assert PEER_FAILS != CHECKPOINTER


def inline_lab_job(owner, dataset, settings, tmp_path, code: bytes, seconds: float) -> tuple[Job, threading.Thread]:
    """A managed job of `code` (the checkpointing trainer's contract) on 2 mirrored lab workers, with the node-loss
    cases' timings (tests/test_node_loss.py), driven inline in a thread of its own: the job and that thread."""
    settings.FC2_NODE_SILENCE_S = losses.SILENCE_S
    settings.FC2_NODE_LOST_S = settings.FC2_NODE_UNREACHABLE_S = losses.LOST_S
    load_catalog("lab")
    request = checkpointer_request(
        owner, dataset, tmp_path, code, seconds, provider="lab", worker_type="lab-w-100", max_restarts=1
    )
    job = jobs.submit(owner, request, driver=Job.Driver.INLINE)
    runner = threading.Thread(target=inline.run_inline, args=(job.pk,), daemon=True)
    runner.start()
    return job, runner


@pytest.mark.heavy
@pytest.mark.skipif(bool(lab_missing), reason=str(lab_missing))
@pytest.mark.django_db(transaction=True)
def test_a_peer_failing_because_a_lab_node_is_gone_resumes_the_job(alice, digits, settings, tmp_path):
    job, runner = inline_lab_job(alice, digits, settings, tmp_path, PEER_FAILS, TRAIN_S)
    try:
        deadline = time.monotonic() + 120
        while checkpoints.latest(job) is None or chief_step(job) % CHECKPOINT_EVERY < 2:
            assert time.monotonic() < deadline and runner.is_alive(), "no checkpoint shipped"
            time.sleep(0.3)
        cluster = ClusterInfo.from_dict(Job.objects.get(pk=job.pk).cluster)
        losses.host_gone(cluster, losses.VICTIM)
        killed_at = timezone.now()
    finally:
        runner.join(timeout=180)
    job.refresh_from_db()
    assert job.state == State.SUCCEEDED, (job.failure_reason, list(job.events.values_list("message", flat=True)))
    (restart,) = job.restarts
    assert restart["nodes"] == [losses.VICTIM] and restart["checkpoint"]
    assert restart["reason"].startswith("worker-1 lost (its machine does not answer): worker-0 failed with exit code")
    seen_s, resumed_s = (
        (datetime.fromisoformat(restart[at]) - killed_at).total_seconds() for at in ("at", "resumed_at")
    )
    figure = {"case": "peer failed", "seen_s": round(seen_s, 1), "training_again_s": round(resumed_s, 1)}
    print(f"\nFIGURE chaos {json.dumps(figure)}")
    assert not job.events.filter(message__contains="moved on by the sweep").exists()  # the restart says it
    assert job.cluster is None
    assert nothing_left(lab_leftovers(cluster.cluster_id, Path(cluster.workdir), lab.tag())) == {}


# Where a lab node is lost once its job's chief has succeeded: while the job is collecting (the collect step held
# there a few seconds, FC2_FAULT_PAUSE, and the chief's own host destroyed), or as its release begins (a worker's
# host destroyed while the workers are waited for, their late reports fetched and the cluster torn down).
LOST_AFTER_TRAINING = {"collecting": "worker-0", "release": losses.VICTIM}


@pytest.mark.heavy
@pytest.mark.skipif(bool(lab_missing), reason=str(lab_missing))
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("moment", LOST_AFTER_TRAINING)
def test_a_lab_node_lost_after_the_chief_succeeded_leaves_the_job_succeeded_and_nothing_behind(
    moment, alice, digits, settings, tmp_path
):
    """The chief's result is on the platform's storage: the job succeeds with it, and with what the surviving
    nodes still hold (their logs); the half-gone cluster is torn down whole."""
    settings.FC2_FAULT_PAUSE = {"collecting": 3} if moment == "collecting" else {}
    victim = LOST_AFTER_TRAINING[moment]
    job, runner = inline_lab_job(alice, digits, settings, tmp_path, CHECKPOINTER, 5)
    try:
        deadline = time.monotonic() + 120
        at = State.COLLECTING if moment == "collecting" else State.SUCCEEDED
        while (now := Job.objects.get(pk=job.pk)).state != at:
            alive = runner.is_alive() and not now.is_terminal
            assert time.monotonic() < deadline and alive, (now.state, now.failure_reason)
            time.sleep(0.05)
        cluster = ClusterInfo.from_dict(now.cluster)
        losses.host_gone(cluster, victim)
        lost_at = timezone.now()
    finally:
        runner.join(timeout=180)
    assert not runner.is_alive()
    job.refresh_from_db()
    assert job.state == State.SUCCEEDED, (job.failure_reason, list(job.events.values_list("message", flat=True)))
    assert job.metrics.get("steps") == 10 and job.restarts == []  # the chief's result; no restart after it
    kept_logs = set(job.artifacts.filter(name__startswith="logs/").values_list("name", flat=True))
    if moment == "collecting":  # what the survivor holds is kept
        assert "logs/worker-1.log" in kept_logs, kept_logs
    assert job.cluster is None and job.torn_down_at is not None
    assert nothing_left(lab_leftovers(cluster.cluster_id, Path(cluster.workdir), lab.tag())) == {}
    figure = {"case": f"lab {victim} lost while {moment}"}
    if moment == "collecting":
        figure["succeeded_s"] = round((job.finished_at - lost_at).total_seconds(), 1)
    figure["torn_down_s"] = round((job.torn_down_at - lost_at).total_seconds(), 1)
    print(f"\nFIGURE chaos {json.dumps(figure)}")
