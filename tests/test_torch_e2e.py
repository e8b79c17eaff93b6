"""The PyTorch example (examples/digits_torch) for real: its checkpoints through the node agent's shipping and
restoring, 2-worker DDP jobs on the local and lab providers, submitted as `submit_job --framework pytorch` is,
trained, measured and recorded under the workload's PyTorch key, a lab grid of it, and a managed PyTorch job whose
worker is lost mid-training resuming from the example's own checkpoint.

The jobs start real torch processes (gloo across nodes); keep them few and small.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import provisioner
from fc2.models import Job
from fc2.services import checkpoints, datasets, jobs
from fc2.services.bundles import store_bundle
from monitor.agent import CHECKPOINT_NOW, Checkpoint, unpack
from provisioner import ClusterInfo
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from tests import test_node_loss as losses
from tests.conftest import call_json, cluster_processes, wait_for
from tests.test_resume import workers_losing  # noqa: F401 (a fixture: real workers with the node-loss timings)

# The example's defaults on the digits set (1,437 training examples): epochs of 22 steps over 2 workers' global batch
# of 64. Its CNN has 8 × (3 × 3 + 1) + 8 × 4 × 4 × 10 + 10 = 1,370 parameters, whose gradients (float32) DDP
# all-reduces every step.
STEPS_PER_EPOCH, GRADIENT_BYTES = 1437 // 64, 1370 * 4
# A worker's bandwidth is measured over at least monitor.figures.MIN_BUSY_S (5 s) of traffic: on the lab 2 workers of
# one intra-op thread each (`--threads=1`: torch's default of one a core has them wait on each other's threads on this
# machine's shared cores, at a pace that depends on its load) train an epoch in ~0.06 s, moving ~320 KB each, so 120
# epochs give it ~7 s at ~40 Mbit/s.
LAB_EPOCHS = 120


def run_example(wheel: Path, tmp_path: Path, *args: str, **env: str) -> tuple[dict, str]:
    """One process of the example straight from its wheel (a zip on sys.path), as a node without a process group
    runs it: (its metrics.json, its output)."""
    output = tmp_path / "out"
    environment = {
        **os.environ,
        "PYTHONPATH": str(wheel),
        "FC2_DATA": str(datasets.materialise_builtin("digits")),
        "FC2_OUTPUT_DIR": str(output),
        "OMP_NUM_THREADS": "1",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-m", "fc2_digits_torch.main", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads((output / "metrics.json").read_text()), done.stdout


@pytest.mark.django_db
def test_a_torch_checkpoint_is_shipped_by_the_agent_and_a_run_resumes_from_it(torch_wheel, tmp_path):
    """The chief's agent ships the checkpoint the example's `checkpoint` index names (its `.pt` alone), the one asked
    for by CHECKPOINT_NOW included; unpacked as a resumed node's agent unpacks it, the example goes on from there."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / CHECKPOINT_NOW).touch()  # a spot notice before the first progress line

    first, printed = run_example(
        torch_wheel, tmp_path, "--epochs=1", "--steps_per_epoch=20", FC2_CHECKPOINT_DIR=str(checkpoints)
    )

    assert "checkpoint ckpt-10 at step 10" in printed and not (checkpoints / CHECKPOINT_NOW).exists()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint", "ckpt-20.pt"]  # the latest only
    shipped = Checkpoint.read(checkpoints, 2**20)
    assert shipped is not None and shipped.name == "ckpt-20" and shipped.archive is not None
    shipped.archive.seek(0)
    (tmp_path / "shipped.tar.gz").write_bytes(shipped.archive.read())
    shipped.close()
    unpack(tmp_path / "shipped.tar.gz", tmp_path / "restore", 2**20)

    resumed, printed = run_example(
        torch_wheel, tmp_path, "--epochs=2", "--steps_per_epoch=20", FC2_RESTORE_FROM=str(tmp_path / "restore")
    )

    assert "restored ckpt-20: 1 epochs done" in printed
    assert (resumed["resumed_at_step"], resumed["steps"], len(resumed["epoch_train_losses"])) == (20, 40, 1)
    assert resumed["epoch_train_losses"][0] < first["epoch_train_losses"][0]  # the trained weights came back
    assert '"epoch": 2, "epochs": 2, "step": 40, "steps": 40' in printed


def submit_torch_job(wheel: Path, provider: str, epochs: int, *args: str) -> tuple[dict, Job]:
    """`submit_job --framework pytorch` with 2 workers, the example's defaults otherwise, run inline to its end."""
    _, result, _ = call_json(  # --wait exits 1 unless the job succeeded, after the JSON
        "submit_job", "--bundle", str(wheel), "--dataset", "digits", "--provider", provider, "--workers", "2",
        "--framework", "pytorch", "--param", f"epochs={epochs}", "--user", "alice", "--inline", "--wait", *args,
    )  # fmt: skip
    assert result["status"] == "succeeded", result.get("error")
    return result, Job.objects.get(pk=result["id"])


def assert_trained(result: dict, job: Job, tmp_path: Path) -> None:
    """What every PyTorch job of the example leaves, whatever its provider: the models and metrics of a DDP run
    over 2 ranks, an exported model (no code of the bundle needed) that scores on the test split what metrics.json
    says, every node's CPU sampled, nothing left running."""
    assert (job.framework, job.strategy, job.workers) == ("pytorch", "ddp", 2)
    assert job.workload.endswith("@pytorch")  # its records never mix with a TensorFlow run's
    names = {a["name"] for a in result["artifacts"]}
    assert {"model.pt", "model.pt2", "metrics.json", "logs/worker-0.log", "logs/worker-1.log"} <= names
    metrics = result["metrics"]
    assert (metrics["strategy"], metrics["backend"], metrics["workers"]) == ("ddp", "gloo", 2)
    assert (metrics["steps"], metrics["global_batch_size"]) == (metrics["epochs"] * STEPS_PER_EPOCH, 64)
    assert metrics["test_accuracy"] > 0.8 and metrics["epoch_time_s"] > 0  # ~0.9 after two epochs

    exported = tmp_path / "model.pt2"
    with job.artifacts.get(name="model.pt2").file.open("rb") as stored:
        exported.write_bytes(stored.read())
    with np.load(datasets.materialise_builtin("digits")) as data:
        images = torch.from_numpy(data["x_test"].transpose(0, 3, 1, 2).copy())
        labels = torch.from_numpy(data["y_test"])
    with torch.no_grad():
        predicted = torch.export.load(exported).module()(images).argmax(dim=1)
    assert float((predicted == labels).float().mean()) == pytest.approx(metrics["test_accuracy"])

    assert sorted(job.nodes.values_list("name", flat=True)) == ["worker-0", "worker-1"]
    for node in job.nodes.all():
        assert node.samples.filter(cpu_percent__gt=0).exists(), f"{node.name}: no CPU sampled"
    assert cluster_processes() == []


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_a_pytorch_job_trains_with_ddp_on_two_local_workers(alice, torch_wheel, tmp_path):
    """Sandboxed processes on this machine: gloo between the nodes' sandboxes. (No performance record: a local node
    is no instance type's machine, fc2/services/feedback.py.)"""
    result, job = submit_torch_job(torch_wheel, "local", 2)

    assert_trained(result, job, tmp_path)


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(bool(provisioner.unavailable("lab")), reason=str(provisioner.unavailable("lab")))
def test_a_pytorch_job_trains_with_ddp_across_two_lab_nodes_and_its_traffic_is_measured(alice, torch_wheel, tmp_path):
    """On the lab each node has a network of its own: what its agent counted out is at least the gradients DDP sent
    every step (a ring all-reduce over 2 ranks sends each rank's whole gradient); the run is a measured record of the
    workload's PyTorch key, strategy ddp, with its bandwidth."""
    load_catalog("lab")
    result, job = submit_torch_job(torch_wheel, "lab", LAB_EPOCHS, "--worker-type", "lab-w-1g", "--param", "threads=1")

    assert_trained(result, job, tmp_path)
    record = PerformanceRecord.objects.get(job_link__job=job, source=PerformanceRecord.Source.MEASURED)
    assert (record.workload, record.strategy, record.workers, record.batch_size) == (job.workload, "ddp", 2, 32)
    assert record.instance_type == "lab-w-1g" and record.epoch_time_s == result["metrics"]["epoch_time_s"]
    assert record.bandwidth_mbps and record.bandwidth_mbps > 0
    for node in job.nodes.all():
        samples = list(node.samples.order_by("measured_at"))
        sent = samples[-1].bytes_sent - samples[0].bytes_sent
        assert sent >= LAB_EPOCHS * STEPS_PER_EPOCH * GRADIENT_BYTES, f"{node.name} sent {sent} B"


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(bool(provisioner.unavailable("lab")), reason=str(provisioner.unavailable("lab")))
def test_lab_sweep_measures_a_pytorch_cell_under_the_workloads_pytorch_key(alice, torch_wheel):
    """The framework read from the wheel (it requires torch): the cell runs as ddp, its record goes under the
    workload's PyTorch key, and the lookup answers from it."""
    load_catalog("lab")
    code, sweep, _ = call_json(
        "lab_sweep", "--bundle", str(torch_wheel), "--dataset", "digits", "--workers", "2", "--batch-sizes", "16",
        "--worker-type", "lab-w-1g", "--workload", "digits-torch-lab", "--param", "epochs=1",
        "--param", "steps_per_epoch=8", "--user", "alice",
    )  # fmt: skip

    assert code == 0 and sweep["workload"] == "digits-torch-lab@pytorch"
    [cell] = sweep["cells"]
    assert (cell["workers"], cell["batch_size"], cell["status"]) == (2, 16, "succeeded")
    assert Job.objects.get(pk=cell["job"]).strategy == "ddp"
    measured = PerformanceRecord.Source.MEASURED
    record = PerformanceRecord.objects.get(workload="digits-torch-lab@pytorch", source=measured)
    assert (record.strategy, record.workers, record.batch_size, record.instance_type) == ("ddp", 2, 16, "lab-w-1g")
    assert record.epoch_time_s == cell["epoch_time_s"] and cell["epoch_time_s"] > 0

    _, chosen, _ = call_json(
        "recommend", "--algorithm", "lookup", "--catalog", "lab", "--workload", "digits-torch-lab@pytorch",
        "--max-workers", "2", "--batch-size", "16", "--latency-ms", "0", "--user", "alice",
    )  # fmt: skip
    assert (chosen["source"], chosen["workers"]) == ("measured", 2)


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(bool(provisioner.unavailable("lab")), reason=str(provisioner.unavailable("lab")))
def test_a_pytorch_worker_lost_on_the_lab_resumes_from_the_examples_checkpoint(
    alice,
    digits,
    torch_wheel,
    workers_losing,  # noqa: F811
):
    """A managed PyTorch job (one restart): its chief's agent ships the example's checkpoints; worker-1's host gone
    mid-training (rank 0 then waits in an all-reduce), the cluster is made again and both ranks go on from the
    checkpoint shipped last, not from the start."""
    load_catalog("lab")
    workers_losing.start()
    with torch_wheel.open("rb") as wheel:
        bundle = store_bundle(alice, wheel, torch_wheel.name)
    parameters = {"epochs": "400", "threads": "1"}  # ~0.06 s an epoch: ~25 s of training
    request = jobs.JobRequest(
        bundle=bundle, dataset=digits, parameters=parameters, provider="lab", worker_type="lab-w-1g", workers=2,
        max_restarts=1,
    )  # fmt: skip
    job = jobs.submit(alice, request, driver=Job.Driver.CELERY)
    assert job.framework == "pytorch"  # read from the wheel

    wait_for(lambda: checkpoints.latest(job) is not None, "a checkpoint shipped", workers_losing)
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING, (job.state, job.failure_reason, workers_losing.logs())
    losses.host_gone(ClusterInfo.from_dict(job.cluster), losses.VICTIM)

    job = losses.sweep_until(job, lambda j: j.is_terminal, 240)
    assert job.state == Job.State.SUCCEEDED, (job.state, job.failure_reason, workers_losing.logs())
    assert job.strategy == "ddp"
    (restart,) = job.restarts
    assert restart["nodes"] == [losses.VICTIM] and restart["checkpoint"]
    assert 0 < job.metrics["resumed_at_step"] < job.metrics["steps"] == 400 * STEPS_PER_EPOCH
    assert job.metrics["test_accuracy"] > 0.8
    losses.check_released(job, "pytorch resumed")
