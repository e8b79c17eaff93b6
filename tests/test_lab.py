"""The lab provider for real: network namespaces with their own sshd, bootstrapped over SSH (paramiko), training with
TensorFlow across them, and torn down to nothing. Skipped, with the reason, where the lab cannot run (not root, tools
missing)."""

from __future__ import annotations

import json
import os
import signal
from datetime import datetime
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

import provisioner
from fc2.models import Job, ReapedCluster
from fc2.services import inline, jobs
from harness.wheels import GOOD, make_wheel, sleeper_wheel
from provisioner import ClusterSpec, NodeError, RunSpec, lab, nodes
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from recommender.perfdata import parse_csv
from tests.conftest import call_json, lab_leftovers, nothing_left

pytestmark = [
    pytest.mark.skipif(bool(provisioner.unavailable("lab")), reason=str(provisioner.unavailable("lab"))),
    pytest.mark.heavy,  # TensorFlow across namespaces
]


@pytest.fixture
def lab_catalog(db):
    return load_catalog("lab")


def leftovers(cluster_id: str) -> dict[str, list[str]]:
    """Whatever of the cluster is still on the machine, by kind ({} when nothing is)."""
    return nothing_left(lab_leftovers(cluster_id, lab._cluster_dir(cluster_id), lab.tag()))


def cluster_command(action: str, *args: str) -> tuple[int, dict]:
    out = StringIO()
    try:
        call_command("cluster", action, "--json", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, json.loads(out.getvalue())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("strategy", ["ps", "mirrored"])
def test_a_lab_job_trains_over_ssh_bootstrapped_nodes_and_leaves_nothing(strategy, alice, example_wheel, lab_catalog):
    _, result, _ = call_json(  # --wait exits 1 unless the job succeeded, after the JSON
        "submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--provider", "lab",
        "--workers", "2", "--strategy", strategy, "--worker-type", "lab-w-250",
        "--param", "epochs=1", "--param", "steps_per_epoch=5", "--user", "alice", "--inline", "--wait",
    )  # fmt: skip

    assert result["status"] == "succeeded", result.get("error")
    job = Job.objects.get(pk=result["id"])
    assert {"model.keras", "metrics.json"} <= {a["name"] for a in result["artifacts"]}
    assert job.catalog == "lab" and job.hourly_cost > 0  # priced from the lab's own catalogue
    addresses = [n.address for n in job.nodes.all()]
    assert all(a.startswith("10.") for a in addresses) and len(set(addresses)) == len(addresses)
    assert all(n.started_at for n in job.nodes.all()), "every node's agent reported (through the bridge's relay)"
    assert any("nodes:" in e.message and "10." in e.message for e in job.events.all())  # the timeline says where
    assert leftovers(job.cluster_name) == {}


TRANSFER_BYTES = 30 * 2**20
# Two mirrored workers: the first listens on its own address, the second sends it TRANSFER_BYTES; both wait before
# and after, so that the agents' samples (one a second) bracket the transfer.
TRANSFER = f"""
import json, os, socket, time
config = json.loads(os.environ["TF_CONFIG"])
cluster, task = config["cluster"], config["task"]
hosts = [address for role in ("chief", "worker") for address in cluster.get(role, [])]
me, receiver = cluster[task["type"]][task["index"]], hosts[0]
host, port = receiver.rsplit(":", 1)
listener = socket.create_server((host, int(port))) if me == receiver else None
time.sleep(3)
if listener:
    connection, _ = listener.accept()
    got = 0
    while chunk := connection.recv(1 << 16):
        got += len(chunk)
    print("received", got, flush=True)
else:
    for _ in range(100):
        try:
            sender = socket.create_connection((host, int(port)))
            break
        except OSError:
            time.sleep(0.1)
    sender.sendall(b"x" * {TRANSFER_BYTES})
    sender.close()
    print("sent", {TRANSFER_BYTES}, flush=True)
time.sleep(3)
""".encode()


@pytest.mark.django_db(transaction=True)
def test_a_known_transfer_between_two_nodes_is_what_both_agents_report(alice, lab_catalog, tmp_path):
    """Each lab node's agent counts its own namespace's traffic: 30 MiB from one node to the other is within 5 % of
    the sender's bytes out and the receiver's bytes in (TCP/IP headers, ACKs and the agents' own reports are the
    rest), and the node that sent nothing shows nearly nothing out."""
    wheel = make_wheel(tmp_path, {**GOOD, "demo/main.py": TRANSFER})
    _, result, _ = call_json(  # --wait exits 1 unless the job succeeded, after the JSON
        "submit_job", "--bundle", str(wheel), "--dataset", "digits", "--provider", "lab", "--workers", "2",
        "--strategy", "mirrored", "--worker-type", "lab-w-1g", "--user", "alice", "--inline", "--wait",
    )  # fmt: skip
    assert result["status"] == "succeeded", result.get("error")

    job = Job.objects.get(pk=result["id"])
    moved = {}
    for node in job.nodes.all():
        samples = list(node.samples.order_by("measured_at"))
        assert len(samples) >= 5, f"{node.name}: {len(samples)} samples"
        first, last = samples[0], samples[-1]
        moved[node.log_tail.split("\n")[-1].split()[0]] = (
            last.bytes_sent - first.bytes_sent,
            last.bytes_recv - first.bytes_recv,
        )
    (sent_out, sent_in), (received_out, received_in) = moved["sent"], moved["received"]
    print(f"\nFIGURE {TRANSFER_BYTES} B sent: sender out {sent_out} B, receiver in {received_in} B")
    assert TRANSFER_BYTES <= sent_out <= TRANSFER_BYTES * 1.05
    assert TRANSFER_BYTES <= received_in <= TRANSFER_BYTES * 1.05
    assert received_out < TRANSFER_BYTES * 0.05 and sent_in < TRANSFER_BYTES * 0.05  # ACKs and the reports


def test_cluster_up_twice_is_one_cluster_whose_nodes_answer_over_ssh(settings):
    name = "fc2-lab-up-twice"
    up = ("up", "--provider", "lab", "--worker-type", "lab-w-100", "--ps-type", "lab-ps-450", "--workers", "2")
    try:
        code, first = cluster_command(*up, "--name", name)
        code_again, again = cluster_command(*up, "--name", name)
        code_ssh, ran = cluster_command("ssh", name, "worker-1", "--", "sh", "-c", "hostname -I; exit 3")
        _, listed = cluster_command("list", "--provider", "lab")

        assert (code, code_again) == (0, 0) and first == again
        assert [(n["name"], n["instance_type"]) for n in first["nodes"]] == [
            ("ps-0", "lab-ps-450"), ("chief-0", "lab-w-100"), ("worker-0", "lab-w-100"), ("worker-1", "lab-w-100"),
        ]  # fmt: skip
        worker_1 = first["nodes"][3]
        assert code_ssh == 3 and ran["stdout"].split() == [worker_1["address"]]  # the node's own address, only
        assert [c["name"] for c in listed["clusters"]].count(name) == 1
    finally:
        code_down, down = cluster_command("down", name)
    assert code_down == 0 and down["removed"]
    assert leftovers(name) == {}
    assert cluster_command("down", name)[0] == 1  # gone: said so, not a traceback


def test_a_node_whose_sshd_is_down_fails_the_bootstrap_by_name_and_leaves_nothing(monkeypatch, example_wheel):
    monkeypatch.setattr(nodes, "READY_TIMEOUT_S", 3)
    cluster = provisioner.launch(ClusterSpec("fc2-lab-no-sshd", "lab", "mirrored", 2, worker_type="lab-w-100"))
    try:
        victim = cluster.nodes[1]
        os.kill(int((Path(victim.workdir) / "sshd" / "sshd.pid").read_text()), signal.SIGKILL)
        run = RunSpec(1, str(example_wheel), "fc2_digits_cnn.main", dataset="", report_url="http://127.0.0.1:9")
        with pytest.raises(NodeError) as failed:
            provisioner.bootstrap(cluster, run)
        assert failed.value.node == victim.name and "did not answer within 3" in str(failed.value)
    finally:
        provisioner.teardown("lab", cluster.cluster_id)
    assert leftovers(cluster.cluster_id) == {}


def test_a_node_reaches_the_other_nodes_and_the_platform_port_only(settings):
    cluster = provisioner.launch(ClusterSpec("fc2-lab-reach", "lab", "mirrored", 2, worker_type="lab-w-100"))
    try:
        gateway = lab.gateway_of(cluster)
        probe = (
            "import socket, sys\n"
            "for host, port in [(sys.argv[1], 22), (sys.argv[2], 5432), (sys.argv[2], 6379), ('127.0.0.1', 5432)]:\n"
            "    s = socket.socket(); s.settimeout(1)\n"
            "    print(host, port, s.connect_ex((host, port)) == 0)\n"
        )
        result = provisioner.run_on(cluster, "worker-0", ["python3", "-c", probe, cluster.nodes[1].host, gateway])
        reached = {tuple(line.split()[:2]): line.split()[2] == "True" for line in result.stdout.splitlines()}
        assert reached == {
            (cluster.nodes[1].host, "22"): True,  # another node of its cluster
            (gateway, "5432"): False,  # the platform's machine: not its database,
            (gateway, "6379"): False,  # nor its broker
            ("127.0.0.1", "5432"): False,  # and its own loopback is its own
        }
    finally:
        provisioner.teardown("lab", cluster.cluster_id)


@pytest.mark.django_db(transaction=True)
def test_lab_sweep_records_each_cell_and_lookup_answers_from_them(alice, example_wheel, lab_catalog, tmp_path):
    """A 2 × 2 grid (workers × latency) of real lab jobs: each cell a measured record the lookup then reads, and the
    grid written as a file `import_perf_data --format csv` reads back."""
    out = StringIO()
    call_command(
        "lab_sweep", "--bundle", str(example_wheel), "--dataset", "digits", "--workers", "1,2",
        "--batch-sizes", "16", "--latency-ms", "0,40", "--strategy", "mirrored", "--worker-type", "lab-w-1g",
        "--workload", "digits-lab", "--param", "epochs=1", "--param", "steps_per_epoch=4", "--user", "alice",
        "--csv", str(tmp_path / "grid.csv"), "--json", stdout=out,
    )  # fmt: skip
    sweep = json.loads(out.getvalue())
    assert sweep["csv"] == str(tmp_path / "grid.csv")
    assert [p.name for p in tmp_path.iterdir() if "grid" in p.name] == ["grid.csv"]  # no temporary file left
    shipped = parse_csv((tmp_path / "grid.csv").read_text())
    assert [(r.workers, r.latency_ms, r.epoch_time_s, r.bandwidth_mbps) for r in shipped] == [
        (c["workers"], c["latency_ms"], c["epoch_time_s"], c["bandwidth_mbps"]) for c in sweep["cells"]
    ]
    assert {(r.workload, r.instance_type, r.strategy) for r in shipped} == {("digits-lab", "lab-w-1g", "mirrored")}
    assert all({"bandwidth_mbps", "cpu_util"} <= set(cell) for cell in sweep["cells"])  # None when not measured

    assert [(c["workers"], c["latency_ms"], c["status"]) for c in sweep["cells"]] == [
        (1, 0.0, "succeeded"), (2, 0.0, "succeeded"), (1, 40.0, "succeeded"), (2, 40.0, "succeeded"),
    ]  # fmt: skip
    records = PerformanceRecord.objects.filter(workload="digits-lab", source=PerformanceRecord.Source.MEASURED)
    assert sorted(records.values_list("workers", "latency_ms", "batch_size", "instance_type")) == [
        (1, 0.0, 16, "lab-w-1g"), (1, 40.0, 16, "lab-w-1g"), (2, 0.0, 16, "lab-w-1g"), (2, 40.0, 16, "lab-w-1g"),
    ]  # fmt: skip
    assert all(r.epoch_time_s and r.epoch_time_s > 0 for r in records)
    times = {(r.workers, r.latency_ms): r.epoch_time_s for r in records}
    assert times[(2, 40.0)] > times[(2, 0.0)]  # two workers talk across the delayed link every step

    answer = StringIO()
    call_command(
        "recommend", "--algorithm", "lookup", "--catalog", "lab", "--workload", "digits-lab", "--max-workers", "2",
        "--batch-size", "16", "--latency-ms", "40", "--user", "alice", "--json", stdout=answer,
    )  # fmt: skip
    # The sweep's records are alice's, as any user's jobs' are: her answers read them, no one else's.
    chosen = json.loads(answer.getvalue())
    assert chosen["source"] == "measured"
    assert chosen["workers"] == min((1, 2), key=lambda n: times[(n, 40.0)])


@pytest.mark.django_db
def test_cluster_reap_removes_what_no_job_records_and_keeps_the_rest(job):
    """A platform that crashed mid-job leaves a cluster named for a job no row records any more: reap finds it by
    name and removes everything of it; a recorded job's cluster, and one made by `cluster up`, stay."""
    orphan, kept, manual = "fc2-999-0a1b2c3d", "fc2-998-0a1b2c3d", "my-lab-cluster"
    for name in (orphan, kept, manual):
        provisioner.launch(ClusterSpec(name, "lab", "mirrored", 1, worker_type="lab-w-100"))
    try:
        Job.objects.filter(pk=job.pk).update(provider="lab", cluster={"cluster_id": kept, "nodes": []})

        code, reaped = cluster_command("reap", "--provider", "lab")

        assert code == 0 and reaped["removed"] == [orphan] and reaped["resources"][orphan]
        assert leftovers(orphan) == {}
        record = ReapedCluster.objects.get()
        assert (record.provider, record.cluster_name, record.job_number, record.by) == ("lab", orphan, 999, "command")
        assert record.resources == reaped["resources"][orphan]
        assert {kept, manual} <= set(provisioner.list_clusters("lab"))
    finally:
        for name in (orphan, kept, manual):
            provisioner.teardown("lab", name)


# Every node but the PS sends to the PS as fast as its link lets it for SEND_S seconds; the PS drains them all.
SATURATE_S = 10
SATURATE = f"""
import json, os, socket, threading, time
config = json.loads(os.environ["TF_CONFIG"])
cluster, task = config["cluster"], config["task"]
host, port = cluster["ps"][0].rsplit(":", 1)
if task["type"] == "ps":
    listener = socket.create_server((host, int(port)))
    def drain(connection):
        while connection.recv(1 << 16):
            pass
    threads = []
    for _ in range(len(cluster.get("chief", [])) + len(cluster.get("worker", []))):
        connection, _ = listener.accept()
        threads.append(threading.Thread(target=drain, args=(connection,)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    print("drained", flush=True)
else:
    time.sleep(2)
    for _ in range(200):
        try:
            sender = socket.create_connection((host, int(port)))
            break
        except OSError:
            time.sleep(0.1)
    end, chunk = time.monotonic() + {SATURATE_S}, b"x" * (1 << 16)
    while time.monotonic() < end:
        sender.sendall(chunk)
    sender.close()
    time.sleep(3)
    print("sent", flush=True)
""".encode()


@pytest.mark.django_db(transaction=True)
def test_a_ps_shaped_to_100_mbits_shows_at_most_that_and_a_saturation_alert(alice, lab_catalog, tmp_path, client):
    """The PS on a type whose link is shaped to 100 Mbit/s (tc tbf), two nodes sending to it flat out: its agent's
    figures stay within the shaping, and the job page says its link is saturated."""
    wheel = make_wheel(tmp_path, {**GOOD, "demo/main.py": SATURATE})
    _, result, _ = call_json(  # --wait exits 1 unless the job succeeded, after the JSON
        "submit_job", "--bundle", str(wheel), "--dataset", "digits", "--provider", "lab", "--workers", "1",
        "--strategy", "ps", "--ps-type", "lab-w-100", "--worker-type", "lab-w-1g", "--user", "alice", "--inline",
        "--wait",
    )  # fmt: skip
    assert result["status"] == "succeeded", result.get("error")

    job = Job.objects.get(pk=result["id"])
    ps = job.figures["ps"]
    print(f"\nFIGURE PS shaped to 100 Mbit/s: mean {ps['mean_mbps']:.1f} Mbps, peak {ps['peak_mbps']:.1f} Mbps")
    assert ps["capacity_mbps"] == 100 and 85 <= ps["mean_mbps"] <= 100
    assert ps["peak_mbps"] <= 105  # one second may carry the bucket's burst
    assert ps["busy_s"] >= SATURATE_S - 2
    assert "ps-saturated" in [a["code"] for a in job.figures["alerts"]]  # (its senders, idle on the CPU, too)
    client.force_login(alice)
    assert 'data-alert="ps-saturated"' in client.get(job.get_absolute_url()).content.decode()
    assert leftovers(job.cluster_name) == {}


@pytest.mark.django_db(transaction=True)
def test_scala_opt_with_no_profile_runs_its_profiling_run_then_the_cluster_it_chose(
    alice, example_wheel, lab_catalog, settings
):
    """FC² §5.2.4 end to end: nothing knows the bandwidth of a lab-w-1g worker for this workload, so the job's profile
    step runs the user's code on 1 PS + 1 worker, measures it, keeps it, and sizes the cluster by it; later jobs of
    the workload find it and run no profiling run."""
    settings.FC2_PROFILE_BUSY_S = 6
    settings.FC2_PROFILE_S = 90
    _, result, _ = call_json(  # --wait exits 1 unless the job succeeded, after the JSON
        "submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--provider", "lab",
        "--algorithm", "scala-opt-m", "--worker-type", "lab-w-1g", "--ps-type", "lab-ps-450", "--workers", "2",
        "--strategy", "ps", "--workload", "digits-profiled", "--param", "epochs=1", "--param", "batch_size=16",
        "--user", "alice", "--inline", "--wait",
    )  # fmt: skip
    assert result["status"] == "succeeded", result.get("error")

    job = Job.objects.get(pk=result["id"])
    (run,) = job.profiling_runs
    profile = PerformanceRecord.objects.get(workload="digits-profiled", source=PerformanceRecord.Source.PROFILED)
    took = (datetime.fromisoformat(run["ended_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()
    print(f"\nFIGURE profiling run of lab-w-1g: {took:.0f} s, b_t {profile.bandwidth_mbps} Mbps")
    assert (profile.instance_type, profile.ps_type, profile.workers, profile.batch_size) == (
        "lab-w-1g",
        "lab-ps-450",
        1,
        16,
    )
    assert profile.bandwidth_mbps == run["bandwidth_mbps"] and profile.bandwidth_mbps > 1
    expected = max(1, min(2, int(450 * 0.95 // profile.bandwidth_mbps)))
    assert (job.recommendation["source"], job.workers) == ("rule", expected)
    assert job.cost_so_far > job.cost_between(start=job.launched_at)  # the profiling run is billed to the job
    timeline = " | ".join(job.events.values_list("message", flat=True))
    assert "profiling run: 1 lab-ps-450 PS + 1 lab-w-1g worker" in timeline and "Mbps (mean over" in timeline
    assert leftovers(run["cluster"]) == {} and leftovers(job.cluster_name) == {}

    again = StringIO()
    call_command(
        "recommend", "--algorithm", "scala-opt-m", "--catalog", "lab", "--workload", "digits-profiled",
        "--worker-type", "lab-w-1g", "--ps-type", "lab-ps-450", "--max-workers", "2", "--batch-size", "16",
        "--user", "alice", "--json", stdout=again,
    )  # fmt: skip
    # What alice's next job of the workload is told at once (the profile is hers, as her jobs' records are).
    assert json.loads(again.getvalue())["workers"] == expected


@pytest.mark.django_db(transaction=True)
def test_scala_opt_measures_the_readmes_two_epoch_example_for_the_runs_window_whatever_its_epochs(
    alice, bundle, digits, lab_catalog, settings
):
    """The README's example as asked (epochs=2: a second or two of training) with Scala-Opt on the lab: its profiling
    run sets FC2_TRAIN_SECONDS, so the example trains on for the run's window and its worker's bandwidth is measured;
    the job then runs on the cluster Scala-Opt sized, training the 2 epochs asked (the variable is the profiling
    run's alone), and its record keeps the steady-state epoch time, start-up apart."""
    settings.FC2_PROFILE_BUSY_S = 6
    settings.FC2_PROFILE_S = 60
    request = jobs.JobRequest(
        bundle=bundle, dataset=digits, parameters={"epochs": "2"}, provider="lab", strategy=Job.Strategy.PS,
        workers=2, algorithm="scala-opt", worker_types=["lab-w-1g"], workload_name="digits-two-epochs",
    )  # fmt: skip
    job = inline.run_inline(jobs.submit(alice, request, driver=Job.Driver.INLINE).pk)
    assert job.state == Job.State.SUCCEEDED, job.failure_reason

    # The last run measured; one before it is a run whose node was lost (profiling.LostNodes: a loaded machine), done
    # again, and ended.
    *retried, run = job.profiling_runs
    assert all(r["ended_at"] and leftovers(r["cluster"]) == {} for r in retried)
    took = (datetime.fromisoformat(run["ended_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()
    profile = PerformanceRecord.objects.get(workload="digits-two-epochs", source=PerformanceRecord.Source.PROFILED)
    print(f"\nFIGURE profiling run of the two-epoch example: {took:.0f} s, b_t {profile.bandwidth_mbps} Mbps")
    assert profile.bandwidth_mbps == run["bandwidth_mbps"] and profile.bandwidth_mbps > 1
    assert (job.recommendation["source"], job.worker_type) == ("rule", "lab-w-1g")
    assert job.metrics["epochs"] == 2 and "train_seconds" not in job.metrics
    assert job.metrics["startup_s"] > 0 and job.metrics["epoch_time_s"] > 0
    measured = PerformanceRecord.objects.get(workload="digits-two-epochs", source=PerformanceRecord.Source.MEASURED)
    assert measured.epoch_time_s == job.metrics["epoch_time_s"]  # the steady state's, not duration_s / epochs
    assert leftovers(run["cluster"]) == {} and leftovers(job.cluster_name) == {}


@pytest.mark.django_db(transaction=True)
def test_a_profiling_run_whose_code_ends_at_once_fails_the_job_saying_what_to_change(
    alice, lab_catalog, tmp_path, settings
):
    """Code that ignores FC2_TRAIN_SECONDS and ends before its worker communicated: the job fails at once (not at the
    end of the run's window) with what to change, naming the variable."""
    settings.FC2_PROFILE_S = 60
    wheel = make_wheel(tmp_path, GOOD)  # prints a line and exits, on every node
    job, took = failed_profiling(wheel, "demo-ends-at-once")
    assert "its training ended" in job.failure_reason and "FC2_TRAIN_SECONDS=60" in job.failure_reason
    assert "more epochs" in job.failure_reason
    assert took < 60


def failed_profiling(wheel: Path, workload: str) -> tuple[Job, float]:
    """Scala-Opt on the lab with `wheel`'s code, whose profiling run fails the job: the job, and the run's seconds once
    checked that it measured and kept nothing and left nothing behind."""
    _, result, _ = call_json(
        "submit_job", "--bundle", str(wheel), "--dataset", "digits", "--provider", "lab", "--algorithm", "scala-opt-m",
        "--worker-type", "lab-w-100", "--ps-type", "lab-ps-450", "--workers", "2", "--strategy", "ps",
        "--workload", workload, "--user", "alice", "--inline", "--wait",
    )  # fmt: skip
    assert result["status"] == "failed"
    job = Job.objects.get(pk=result["id"])
    (run,) = job.profiling_runs
    assert run["bandwidth_mbps"] is None
    assert not PerformanceRecord.objects.filter(workload=workload).exists()
    assert leftovers(run["cluster"]) == {}
    return job, (datetime.fromisoformat(run["ended_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()


@pytest.mark.django_db(transaction=True)
def test_a_profiling_run_whose_worker_never_communicates_ends_after_its_start_and_window(
    alice, lab_catalog, tmp_path, settings
):
    """Code that runs on and never trains: the run waits for its start (FC2_RUN_START_S) and its window (FC2_PROFILE_S),
    no longer, and fails the job saying both; its cluster is torn down."""
    settings.FC2_PROFILE_S = 2
    settings.FC2_RUN_START_S = 4
    wheel = sleeper_wheel(tmp_path)  # says it is up and sleeps ten minutes, on every node
    job, took = failed_profiling(wheel, "demo-never-trains")
    assert "hardly communicated in the run's 2 s (FC2_PROFILE_S)" in job.failure_reason
    assert "the 4 s its code may take to start (FC2_RUN_START_S)" in job.failure_reason
    assert took < 60  # its cluster's start, 6 s of waiting, its teardown
