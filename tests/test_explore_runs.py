"""explore's trial runs for real (issue 44 §1, §4): each trial a real cluster of the job's code on the lab (network
namespaces + sshd) or on aws (moto's EC2, its instances as lab hosts), trained for FC2_EXPLORE_TRIAL_S, measured from
the chief's kept metrics.json, recorded (source trial) and torn down; the job then runs on the cluster the search
chose, its cost counting the trials. A failed trial is recorded and not tried again; a search where nothing ran
fails the job saying why; a cancel during a trial tears it down. And the door: a trial's metrics.json is the job's
own code's, checked as hostile input."""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

import provisioner
from fc2.models import Job
from fc2.services import inline, jobs, pipeline, planning, profiling, sweep, trials
from fc2.services.bundles import store_bundle
from harness.ec2lab import NOTHING, REGION, ec2, everything_tagged
from harness.wheels import GOOD, make_wheel, sleeper_wheel
from provisioner import ClusterInfo, NodeResult, lab
from provisioner.lab import net as labnet
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from recommender.types import TrialConfig
from tests.test_aws import inject_capacity_shortage
from tests.test_lab import leftovers

LAB = pytest.mark.skipif(bool(provisioner.unavailable("lab")), reason=str(provisioner.unavailable("lab")))
# The digits example (examples/digits_cnn): tiny epochs, so that a trial's window holds many and its steady state
PARAMETERS = {"epochs": "1", "steps_per_epoch": "5", "batch_size": "16"}


def kept_result(metrics: bytes | None, status: str = "succeeded") -> NodeResult:
    """What a chief's agent keeps on its node once its command ended (monitor/agent.py's keep_result)."""
    outputs = [{"file": "0", "path": "metrics.json"}] if metrics is not None else []
    report = {"status": status, "exit_code": 0 if status == "succeeded" else 1, "outputs": outputs,
              "log_tail": "Traceback …\nRuntimeError: boom"}  # fmt: skip
    return NodeResult(report=report, files={"0": metrics} if metrics is not None else {})


@pytest.mark.parametrize(
    ("metrics", "why"),
    [
        (b'{"epoch_time_s": NaN}', "no epoch time"),
        (b'{"epoch_time_s": 1e308}', "epoch_time_s"),
        (b'{"epoch_time_s": -2}', "no epoch time"),
        (b'{"duration_s": 6, "epochs": 99999999999999999999999999999999}', "epoch_time_s"),
        (b"not json", "no epoch time"),
        (b'{"loss": 0.1}', "no epoch time"),
        (None, "wrote no metrics.json"),
    ],
)
def test_a_trials_metrics_are_the_codes_own_and_checked_at_the_door(metrics, why):
    with pytest.raises(trials.TrialFailed, match=why):
        trials._epoch_time("worker-0", kept_result(metrics))


@pytest.mark.parametrize(
    ("limit_s", "looks", "lost"),
    [
        (0, [{"ps-0": True, "worker-0": None}], "worker-0"),  # silent for the whole (nil) limit: lost
        (3600, [{"ps-0": True, "worker-0": None}], None),  # silent, but not for long yet
        (0, [{"ps-0": None, "worker-0": False}], "ps-0"),  # ended is not lost; a PS that does not answer is
        (0, [{"ps-0": True, "worker-0": True}, {"ps-0": True, "worker-0": False}], None),  # answering, then ended
    ],
)
def test_a_short_runs_node_is_lost_once_its_machine_has_not_answered_for_the_limit(settings, limit_s, looks, lost):
    """Profiling runs and trials tell a lost node (its machine gone) by one rule: a trial's is a failed trial; a
    profiling run's makes its recommend step be tried again (a PS lost no longer waits out the window)."""
    settings.FC2_NODE_UNREACHABLE_S = limit_s
    nodes = profiling.LostNodes()
    assert [nodes.lost(alive) for alive in looks][-1] == lost


def test_a_trial_whose_chief_failed_says_so_with_its_log():
    with pytest.raises(trials.TrialFailed, match=r"^worker-0's code failed \(exit 1\): RuntimeError: boom$"):
        trials._epoch_time("worker-0", kept_result(b'{"epoch_time_s": 1.5}', status="failed"))
    assert trials._epoch_time("chief-0", kept_result(b'{"epoch_time_s": 1.5, "startup_s": 4}')) == 1.5


def explore_job(owner, bundle, dataset, **fields) -> Job:
    request = jobs.JobRequest(
        bundle=bundle, dataset=dataset, parameters=dict(PARAMETERS), provider="lab", algorithm="explore",
        strategy=Job.Strategy.MIRRORED, **fields,
    )  # fmt: skip
    return jobs.submit(owner, request, driver=Job.Driver.INLINE)


@pytest.fixture
def quick_looks(monkeypatch):
    """A trial's nodes asked every half second whether its code still runs: its end is seen at once, not up to
    trials.POLL_S (3 s) later, which would only add idle time to each trial here."""
    monkeypatch.setattr(trials, "POLL_S", 0.5)


def seconds(run: dict) -> float:
    return (datetime.fromisoformat(run["ended_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()


@LAB
@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_an_explore_job_runs_its_trials_then_the_cluster_it_chose_and_its_next_job_needs_none(
    alice, bundle, digits, settings, quick_looks
):
    """Two worker types × 1–3 workers, all-reduce: trials of the digits example on the lab, each recorded and torn
    down, then the job on the cluster chosen; the trials' cost is part of the job's. A second job of the workload
    plans from the first's records with fewer trials (none, once three succeeded)."""
    load_catalog("lab")
    settings.FC2_EXPLORE_TRIAL_S = 6
    asked = {"worker_types": ["lab-w-100", "lab-w-1g"], "workers": 3, "workload_name": "digits-explored"}
    job = inline.run_inline(explore_job(alice, bundle, digits, search_minutes=5, **asked).pk)
    assert job.state == Job.State.SUCCEEDED, job.failure_reason

    made = trials.entries(job)
    measured = [run for run in made if run["epoch_time_s"]]
    print(
        f"\nFIGURE explore on the lab: {len(made)} trials of {settings.FC2_EXPLORE_TRIAL_S} s windows, "
        + ", ".join(f"{trials.describe(run)} {run['epoch_time_s']} s in {seconds(run):.0f} s" for run in made)
        + f"; search {job.search['reason']!r}, ${job.search['spent_dollars']}"
    )
    assert 2 <= len(made) <= 4 and measured, made
    assert len({trials._key(run) for run in made}) == len(made)  # no cluster tried twice
    records = PerformanceRecord.objects.filter(workload="digits-explored", source=PerformanceRecord.Source.TRIAL)
    assert sorted(r.pk for r in records) == sorted(run["record"] for run in made)
    for run in made:
        record = records.get(pk=run["record"])
        assert (record.instance_type, record.workers, record.strategy, record.ps_type) == (
            run["worker_type"], run["workers"], "mirrored", ""
        )  # fmt: skip
        assert record.owner == alice and record.batch_size == 16 and record.epoch_time_s == run["epoch_time_s"]
        assert record.origin == f"trial run {run['number']} of job {job.pk} on lab"
        assert run["ended_at"] and run["window_ends_at"] and run["hourly_cost"] > 0 and run["error"] == ""
        assert leftovers(run["cluster"]) == {}

    # The job ran on a cluster a trial measured, its cost counting the trials'.
    chosen = (job.worker_type, job.workers)
    assert chosen in {(run["worker_type"], run["workers"]) for run in measured}
    assert job.search["after"]["worker_type"] == job.worker_type and job.search["after"]["workers"] == job.workers
    assert job.search["trials"] == len(made) and not job.search["no_trial_needed"] and job.search["reason"]
    assert job.search["budget_minutes"] == 5
    trial_cost = sum(run["hourly_cost"] * seconds(run) / 3600 for run in made)
    assert job.search["spent_dollars"] == pytest.approx(trial_cost, abs=1e-4)
    assert job.cost_so_far == pytest.approx(trial_cost + job.cost_between(start=job.launched_at), rel=1e-6)
    assert leftovers(job.cluster_name) == {}
    timeline = " | ".join(job.events.values_list("message", flat=True))
    assert "trial run 1: " in timeline and "epoch time" in timeline and "explore: " in timeline

    # The next job of the workload starts from these records.
    again = explore_job(alice, bundle, digits, search_minutes=5, **asked)
    assert pipeline.run_step("recommend", again.pk), Job.objects.get(pk=again.pk).failure_reason
    again.refresh_from_db()
    print(f"FIGURE the next explore job of the workload: {again.search['trials']} trials ({again.search['reason']})")
    assert again.search["trials"] < len(made)
    if len(measured) >= 3:  # the surrogate is fitted: another trial is worth less than it costs
        assert again.search["no_trial_needed"] and again.search["trials"] == 0
    pipeline.cancel(again, "alice")
    pipeline.release(again.pk)
    assert all(leftovers(run["cluster"]) == {} for run in trials.entries(Job.objects.get(pk=again.pk)))


CRASHES = b"import sys\nprint('loading', flush=True)\nraise RuntimeError('boom: this code does not run')\n"


@LAB
@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_a_search_whose_code_crashes_records_each_failure_once_and_fails_the_job_saying_why(
    alice, digits, settings, tmp_path
):
    load_catalog("lab")
    with make_wheel(tmp_path, {**GOOD, "demo/main.py": CRASHES}).open("rb") as wheel:
        crashing = store_bundle(alice, wheel, "demo-1.0-py3-none-any.whl")
    settings.FC2_EXPLORE_TRIAL_S = 10
    # One worker type, 1 or 2 workers: two clusters to try, both fail.
    job = explore_job(alice, crashing, digits, worker_types=["lab-w-100"], workers=2, workload_name="demo-crashes")
    job = inline.run_inline(job.pk)

    assert job.state == Job.State.FAILED
    made = trials.entries(job)
    took = [round(seconds(run)) for run in made]
    print(f"\nFIGURE a crashing search: {len(made)} trials, {took} s each; {job.failure_reason}")
    assert [run["workers"] for run in sorted(made, key=lambda run: run["workers"])] == [1, 2]  # each once
    assert job.failure_reason.startswith("recommend failed: Explore found no cluster that runs demo-crashes")
    for run in made:
        assert run["error"].endswith("'s code failed (exit 1): RuntimeError: boom: this code does not run")
        assert f"trial {run['number']} ({trials.describe(run)}): {run['error']}" in job.failure_reason
        assert run["epoch_time_s"] is None and seconds(run) < 60  # not the window's grace: it ended at once
        record = PerformanceRecord.objects.get(pk=run["record"])
        assert record.source == PerformanceRecord.Source.TRIAL and record.epoch_time_s is None and record.failed
        assert leftovers(run["cluster"]) == {}
        kept = job.artifacts.get(name=f"logs/trial-{run['number']}/worker-0.log")  # its nodes' logs, for the user
        with kept.file.open("rb") as log:
            assert b"RuntimeError: boom" in log.read()
    assert job.search is None and job.cluster is None and job.cost_so_far > 0  # the failed trials are billed


# Two workers: sleeps until its host is lost; one worker: ends at once, writing no metrics.json.
LOSES_A_NODE = b"""import json, os, time
workers = len(json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {}).get("worker", []))
print("up with", workers, "workers", flush=True)
if workers > 1:
    time.sleep(600)
"""


@LAB
@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_a_trial_that_loses_a_node_is_recorded_as_failed_and_the_search_goes_on(alice, digits, settings, tmp_path):
    """Its second worker's host goes (namespace and processes, as a terminated instance): the trial fails naming it,
    is torn down, and the search tries the other cluster (which measures nothing either: the job fails, saying
    both)."""
    load_catalog("lab")
    settings.FC2_NODE_UNREACHABLE_S = 5
    with make_wheel(tmp_path, {**GOOD, "demo/main.py": LOSES_A_NODE}).open("rb") as wheel:
        code = store_bundle(alice, wheel, "demo-1.0-py3-none-any.whl")
    job = explore_job(alice, code, digits, worker_types=["lab-w-100"], workers=2, workload_name="demo-loses-a-node")

    def lose_worker_1() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            current = Job.objects.get(pk=job.pk)
            if any(run.get("window_ends_at") and run["workers"] == 2 for run in trials.entries(current)):
                cluster = ClusterInfo.from_dict(current.cluster)
                victim = next(node for node in cluster.nodes if node.name == "worker-1")
                labnet.remove_node(lab.tag(), cluster.cluster_id, int(victim.instance_id.rsplit("-", 1)[1]))
                return
            time.sleep(0.3)

    killer = threading.Thread(target=lose_worker_1)
    killer.start()
    job = inline.run_inline(job.pk)
    killer.join()

    assert job.state == Job.State.FAILED
    lost = next(run for run in trials.entries(job) if run["workers"] == 2)
    other = next(run for run in trials.entries(job) if run["workers"] == 1)
    print(f"\nFIGURE a trial that lost a node: ended {seconds(lost):.0f} s after its start: {lost['error']}")
    assert lost["error"] == "worker-1 was lost: its machine did not answer for 5 s"
    assert other["error"] == "worker-0 wrote no metrics.json, so no epoch time (examples/README.md)"
    assert f"trial {lost['number']} (2 × lab-w-100, all-reduce): worker-1 was lost" in job.failure_reason
    for run in (lost, other):
        assert PerformanceRecord.objects.get(pk=run["record"]).epoch_time_s is None
        assert leftovers(run["cluster"]) == {}


@LAB
@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_a_search_whose_worker_was_lost_mid_trial_tears_that_trial_down_and_goes_on(alice, digits, tmp_path):
    """The recommend step's worker died during trial 1, its cluster up: the step done again (as the sweep does it)
    tears that cluster down, ends the trial saying why, counts what it cost, and goes on with the search — here a
    code that writes no metrics, so the job then fails listing both trials."""
    load_catalog("lab")
    with make_wheel(tmp_path, GOOD).open("rb") as wheel:  # prints a line and ends: no metrics.json
        code = store_bundle(alice, wheel, "demo-1.0-py3-none-any.whl")
    job = explore_job(alice, code, digits, worker_types=["lab-w-100"], workers=1, workload_name="demo-lost-worker")
    assert job.transition(Job.State.QUEUED, Job.State.RECOMMENDING, "choosing the cluster")
    # What the lost step had made: trial 1's cluster, recorded on the job as trials.run_trial records it.
    spec = profiling.cluster_spec(job, "mirrored", 1, "lab-w-100", "")
    stale = {"kind": "trial", "number": 1, "worker_type": "lab-w-100", "ps_type": "", "workers": 1,
             "strategy": "mirrored", "batch_size": 16, "cluster": spec.cluster_id, "hourly_cost": 0.2,
             "started_at": timezone.now().isoformat(), "window_ends_at": None, "ended_at": None,
             "epoch_time_s": None, "error": "", "record": None}  # fmt: skip
    profiling.keep_entry(job, stale, cluster=provisioner.launch(spec).to_dict())
    assert leftovers(spec.cluster_id) != {}

    assert not pipeline.run_step("recommend", job.pk, resume=True)

    job.refresh_from_db()
    first, second = trials.entries(job)
    assert first["cluster"] == spec.cluster_id and first["ended_at"] and first["record"] is None
    assert first["error"] == "the worker running it was lost before it measured anything"
    assert leftovers(spec.cluster_id) == {} and leftovers(second["cluster"]) == {}
    assert second["error"] == "worker-0 wrote no metrics.json, so no epoch time (examples/README.md)"
    assert job.state == Job.State.FAILED and "trial 1 (1 × lab-w-100, all-reduce): the worker running it was lost" in (
        job.failure_reason
    )
    assert job.cost_so_far >= trials.spent(job)[0] > 0  # both billed


@LAB
@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_cancelling_during_a_trial_tears_it_down(alice, digits, settings, tmp_path):
    load_catalog("lab")
    with sleeper_wheel(tmp_path).open("rb") as wheel:  # sleeps ten minutes: the trial runs until cancelled
        sleeper = store_bundle(alice, wheel, "demo-1.0-py3-none-any.whl")
    job = explore_job(alice, sleeper, digits, worker_types=["lab-w-100"], workers=1, workload_name="demo-sleeps")

    def cancel_once_training() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(run.get("window_ends_at") for run in trials.entries(Job.objects.get(pk=job.pk))):
                pipeline.cancel(Job.objects.get(pk=job.pk), "alice")
                return
            time.sleep(0.5)

    canceller = threading.Thread(target=cancel_once_training)
    canceller.start()
    started = time.monotonic()
    job = inline.run_inline(job.pk)
    canceller.join()

    assert job.state == Job.State.CANCELLED and job.cluster is None
    (run,) = trials.entries(job)
    assert run["ended_at"] and "the job ended while its trial run ran" in run["error"] and run["record"] is None
    assert not PerformanceRecord.objects.filter(workload="demo-sleeps").exists()  # a cancel measures nothing
    assert leftovers(run["cluster"]) == {}
    assert time.monotonic() - started < settings.FC2_EXPLORE_TRIAL_S  # torn down at the cancel, not at the window


@LAB
@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_a_trial_whose_code_never_ends_is_given_up_after_its_start_and_window(alice, digits, settings, tmp_path):
    """A trial's code that trains on past its window: the trial waits for its start (FC2_RUN_START_S) and its last
    epoch past the window, no longer; it is recorded as failed, saying what to change, and torn down."""
    load_catalog("lab")
    with sleeper_wheel(tmp_path).open("rb") as wheel:  # sleeps ten minutes
        sleeper = store_bundle(alice, wheel, "demo-1.0-py3-none-any.whl")
    settings.FC2_EXPLORE_TRIAL_S = 2
    settings.FC2_RUN_START_S = 4
    job = explore_job(alice, sleeper, digits, worker_types=["lab-w-100"], workers=1, workload_name="demo-never-ends")
    job = inline.run_inline(job.pk)

    assert job.state == Job.State.FAILED and job.cluster is None
    (run,) = trials.entries(job)
    assert run["error"].startswith("its code did not end within 6 s of its start (2 s of training asked by ")
    assert "4 s more for its start, FC2_RUN_START_S" in run["error"] and run["error"] in job.failure_reason
    assert seconds(run) < 60  # its cluster's start, 6 s of waiting, its teardown
    assert PerformanceRecord.objects.get(pk=run["record"]).failed
    assert leftovers(run["cluster"]) == {}


# Trials at once (issue 44): where the provider's nodes are machines of their own, the search's batch runs together.


def test_trials_overlap_only_where_the_nodes_are_machines_of_their_own(settings):
    settings.FC2_EXPLORE_AT_ONCE = 3
    assert planning.trials_at_once("aws") == 3
    assert planning.trials_at_once("lab") == planning.trials_at_once("local") == 1  # this machine's CPUs, shared
    settings.FC2_EXPLORE_AT_ONCE = 500
    assert planning.trials_at_once("aws") == provisioner.get("aws").max_workers  # never more than it holds


def test_a_searchs_minutes_are_wall_clock_and_its_dollars_the_sum():
    """Two trials of 10 minutes that overlap by 5, then one of 2 minutes after a pause: 17 minutes, not 22."""
    at = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def run(start: int, end: int, hourly: float) -> dict:
        started, ended = (at + timedelta(minutes=start)).isoformat(), (at + timedelta(minutes=end)).isoformat()
        return {"kind": "trial", "started_at": started, "ended_at": ended, "hourly_cost": hourly}

    profiled = run(0, 30, 100.0) | {"kind": "profiling"}  # not the search's
    job = Job(profiling_runs=[run(0, 10, 6.0), run(5, 15, 12.0), run(20, 22, 30.0), profiled])
    dollars, minutes, _ = trials.spent(job, now=at + timedelta(hours=1))
    assert minutes == pytest.approx(17.0)
    assert dollars == pytest.approx(1.0 + 2.0 + 1.0)


@pytest.mark.django_db(transaction=True)
def test_runs_that_overlap_never_lose_each_others_entry(job):
    """Eight runs kept from eight threads at once, each three times (recorded, launched, ended), merged under the
    job's row lock (SELECT … FOR UPDATE on PostgreSQL: run with DATABASE_URL): every entry is there, in its place,
    and the job records a cluster exactly while one is up."""
    earlier = {"kind": "trial", "cluster": "fc2-0-earlier", "number": 0, "ended_at": "2026-01-01T00:00:00+00:00"}
    Job.objects.filter(pk=job.pk).update(profiling_runs=[earlier])
    start = threading.Barrier(8)
    failures: list[BaseException] = []

    def keep(number: int) -> None:
        try:
            mine = Job.objects.get(pk=job.pk)
            entry = {"kind": "trial", "number": number, "cluster": f"fc2-{job.pk}-{number:08x}", "ended_at": None}
            start.wait()
            placeholder = ClusterInfo(entry["cluster"], "lab", "mirrored", nodes=()).to_dict()
            profiling.keep_entry(mine, entry, cluster=placeholder)
            profiling.keep_entry(mine, entry | {"window_ends_at": "soon"}, cluster=placeholder)
            profiling.keep_entry(mine, entry | {"window_ends_at": "soon", "ended_at": timezone.now().isoformat()})
        except BaseException as error:
            failures.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=keep, args=(number,)) for number in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not failures, failures
    job.refresh_from_db()
    assert job.profiling_runs[0]["cluster"] == "fc2-0-earlier"
    assert sorted(run["number"] for run in job.profiling_runs[1:]) == list(range(1, 9))
    assert all(run["ended_at"] and run["window_ends_at"] == "soon" for run in job.profiling_runs[1:])
    assert job.cluster is None  # the last to end handed it to none


@pytest.mark.django_db(transaction=True)  # (its trials may run at once, each thread on a connection of its own)
def test_a_trial_with_no_capacity_blocks_its_type_for_the_rest_of_the_search_and_records_nothing(
    aws_env, alice, bundle, digits, monkeypatch
):
    """The cloud has neither type in any zone: each trial's launch fails for want of capacity, which is no
    measurement and no reason to do the step again; the search goes on without that type, then has none left."""
    load_catalog("fc2-2018")
    inject_capacity_shortage(monkeypatch, {(kind, f"{REGION}{zone}") for kind in ("c4.xlarge", "m4.xlarge")
                                           for zone in "abc"})  # fmt: skip
    request = jobs.JobRequest(
        bundle=bundle, dataset=digits, parameters=dict(PARAMETERS), provider="aws", region=REGION,
        algorithm="explore", strategy=Job.Strategy.MIRRORED, worker_types=["c4.xlarge", "m4.xlarge"], workers=2,
        workload_name="digits-no-capacity", search_budget=Decimal("1"),
    )  # fmt: skip
    job = inline.run_inline(jobs.submit(alice, request, driver=Job.Driver.INLINE).pk)

    assert job.state == Job.State.FAILED
    made = trials.entries(job)
    print(f"\nFIGURE a search with no capacity: {len(made)} trials; {job.failure_reason}")
    assert {run["no_capacity"] for run in made} == {"c4.xlarge", "m4.xlarge"} and trials.blocked(job) == {
        "c4.xlarge", "m4.xlarge"
    }  # fmt: skip
    assert "No worker type the job may use has capacity (tried c4.xlarge, m4.xlarge)" in job.failure_reason
    for run in made:
        assert run["record"] is None and run["ended_at"] and "no capacity for" in run["error"]
        assert f"trial {run['number']} ({trials.describe(run)}): no capacity for {run['worker_type']}" in (
            job.failure_reason
        )
        assert everything_tagged(run["cluster"]) == NOTHING
    assert not PerformanceRecord.objects.filter(workload="digits-no-capacity").exists()
    timeline = list(job.events.values_list("message", flat=True))
    assert any(f"the search goes on without {kind}" in line for kind in ("c4.xlarge", "m4.xlarge")
               for line in timeline)  # fmt: skip
    assert not any("sent again" in line or "retry" in line for line in timeline)  # the step was not done again
    assert job.cluster is None and provisioner.list_clusters("aws", REGION) == []


@pytest.fixture
def shared_subnet(ec2_hosts, settings):
    """The operator's subnet (FC2_AWS_SUBNET_ID) for every cluster: trials at once get distinct private addresses,
    which the lab hosts standing in for moto's instances need (a VPC of each cluster's own, of the same CIDR, would
    give both clusters' first node the same one)."""
    client = ec2()
    vpc = client.create_vpc(CidrBlock=settings.FC2_AWS_VPC_CIDR)["Vpc"]["VpcId"]
    cidr = str(next(ipaddress.ip_network(settings.FC2_AWS_VPC_CIDR).subnets(new_prefix=24)))
    subnet = client.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
    settings.FC2_AWS_SUBNET_ID = subnet
    yield subnet
    client.delete_subnet(SubnetId=subnet)
    client.delete_vpc(VpcId=vpc)


def aws_trials(owner, code, dataset, name: str) -> tuple[Job, tuple[TrialConfig, ...]]:
    """An explore job on aws in its recommend step, and a batch of two trials: 1 c4.xlarge and 2 m4.xlarge workers,
    all-reduce (what the search's estimate names as `batch` where trials may overlap)."""
    load_catalog("fc2-2018")
    request = jobs.JobRequest(
        bundle=code, dataset=dataset, parameters=dict(PARAMETERS), provider="aws", region=REGION,
        algorithm="explore", strategy=Job.Strategy.MIRRORED, worker_types=["c4.xlarge", "m4.xlarge"], workers=2,
        workload_name=name, search_budget=Decimal("1"),
    )  # fmt: skip
    job = jobs.submit(owner, request, driver=Job.Driver.INLINE)
    assert job.transition(Job.State.QUEUED, Job.State.RECOMMENDING, "choosing the cluster")
    batch = (TrialConfig("c4.xlarge", 1, "", "mirrored", 0.199), TrialConfig("m4.xlarge", 2, "", "mirrored", 0.2))
    return job, batch


def instances_of(cluster_id: str) -> list[dict]:
    tagged = {"Name": "tag:fc2:cluster", "Values": [cluster_id]}
    return [i for r in ec2().describe_instances(Filters=[tagged])["Reservations"] for i in r["Instances"]]


@contextmanager
def watching(job_id: int) -> Iterator[list[str]]:
    """The clusters whose instances EC2 had while the job recorded them nowhere (neither among its runs nor as its
    cluster), looked at every 0.2 s while the block runs: what a cancel, the release or the sweep would miss."""
    unrecorded: list[str] = []
    done = threading.Event()

    def watch() -> None:
        try:
            while not done.is_set():
                described = ec2().describe_instances()["Reservations"]
                running = {aws_tag(instance) for r in described for instance in r["Instances"]} - {None}
                job = Job.objects.get(pk=job_id)
                recorded = {run["cluster"] for run in job.profiling_runs} | {(job.cluster or {}).get("cluster_id")}
                unrecorded.extend(sorted(running - recorded - {job.cluster_name}))
                time.sleep(0.2)
        finally:
            connection.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield unrecorded
    finally:
        done.set()
        watcher.join()


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_an_aws_explore_jobs_trials_run_at_once_each_recorded_before_it_is_made(
    shared_subnet, alice, bundle, digits, settings, quick_looks
):
    """Two clusters to try (1 or 2 c4.xlarge workers, an m4.large PS): the search's batch runs both at once on moto's
    EC2 (its instances as lab hosts), each cluster recorded on the job before it is made, launched and terminated,
    measured and recorded; then the job runs on the one chosen, its cost counting both trials, the search's minutes
    the wall-clock."""
    load_catalog("fc2-2018")
    settings.FC2_EXPLORE_TRIAL_S = 6
    settings.FC2_EXPLORE_AT_ONCE = 2
    request = jobs.JobRequest(
        bundle=bundle, dataset=digits, parameters=dict(PARAMETERS), provider="aws", region=REGION,
        algorithm="explore", strategy=Job.Strategy.PS, ps_type="m4.large", worker_types=["c4.xlarge"], workers=2,
        workload_name="digits-explored-aws", search_budget=Decimal("1"),
    )  # fmt: skip
    job = jobs.submit(alice, request, driver=Job.Driver.INLINE)
    with watching(job.pk) as unrecorded:
        job = inline.run_inline(job.pk)
    assert job.state == Job.State.SUCCEEDED, job.failure_reason

    made = trials.entries(job)
    dollars, minutes, _ = trials.spent(job)
    measured = ", ".join(f"{trials.describe(run)} {run['epoch_time_s'] or run['error']} s" for run in made)
    print(
        f"\nFIGURE two aws trials at once: {measured}; {sum(map(seconds, made)) / 60:.2f} trial minutes in "
        f"{minutes:.2f} wall-clock, ${dollars:.4f}"
    )
    assert not unrecorded, f"instances of clusters the job did not record: {unrecorded}"
    assert sorted(run["workers"] for run in made) == [1, 2]
    spans = [(datetime.fromisoformat(run["started_at"]), datetime.fromisoformat(run["ended_at"])) for run in made]
    assert max(start for start, _ in spans) < min(end for _, end in spans)  # they overlapped
    assert minutes < sum(map(seconds, made)) / 60
    for run in made:
        assert run["epoch_time_s"] and run["error"] == "" and run["ended_at"], run["error"]
        record = PerformanceRecord.objects.get(pk=run["record"])
        assert record.source == PerformanceRecord.Source.TRIAL and record.epoch_time_s == run["epoch_time_s"]
        launched = instances_of(run["cluster"])  # its PS, its chief and its workers
        assert sorted(i["InstanceType"] for i in launched) == ["c4.xlarge"] * (run["workers"] + 1) + ["m4.large"]
        assert {i["State"]["Name"] for i in launched} == {"terminated"}
        assert everything_tagged(run["cluster"]) == NOTHING
    assert (job.worker_type, job.ps_type) == ("c4.xlarge", "m4.large") and everything_tagged(
        job.cluster_name
    ) == NOTHING
    assert job.search["trials"] == 2 and job.search["spent_dollars"] == pytest.approx(dollars, abs=1e-4)
    assert job.cost_so_far == pytest.approx(dollars + job.cost_between(start=job.launched_at), rel=1e-6)


def aws_tag(instance: dict) -> str | None:
    return next((tag["Value"] for tag in instance.get("Tags", []) if tag["Key"] == "fc2:cluster"), None)


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_cancelling_during_an_aws_batch_tears_every_trial_of_it_down(shared_subnet, alice, digits, tmp_path):
    with sleeper_wheel(tmp_path).open("rb") as wheel:  # sleeps ten minutes: the trials run until cancelled
        sleeper = store_bundle(alice, wheel, "demo-1.0-py3-none-any.whl")
    job, batch = aws_trials(alice, sleeper, digits, "demo-sleeps-at-once")

    def cancel_once_both_train() -> None:
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                current = Job.objects.get(pk=job.pk)
                if sum(bool(run.get("window_ends_at")) for run in trials.entries(current)) == 2:
                    pipeline.cancel(current, "alice")
                    return
                time.sleep(0.3)
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel_once_both_train)
    canceller.start()
    with pytest.raises(profiling.JobEnded):
        trials.run_batch(job, batch, pipeline.run_spec(job))
    canceller.join()
    pipeline.release(job.pk)  # as the step's runner does once it ends

    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED and job.cluster is None
    made = trials.entries(job)
    assert len(made) == 2
    for run in made:
        assert run["ended_at"] and "the job ended while its trial run ran" in run["error"] and run["record"] is None
        assert {i["State"]["Name"] for i in instances_of(run["cluster"])} == {"terminated"}
        assert everything_tagged(run["cluster"]) == NOTHING
    assert provisioner.list_clusters("aws", REGION) == []
    assert not PerformanceRecord.objects.filter(workload="demo-sleeps-at-once").exists()


@pytest.mark.django_db(transaction=True)
def test_every_trial_cluster_not_ended_is_the_jobs_until_a_redone_step_tears_them_all_down(aws_env, job):
    """Two trials under way at once (their clusters on moto's EC2), one of them Job.cluster: the sweep's orphan check
    counts both as the job's, and the recommend step done again tears both down and ends them."""
    load_catalog("fc2-2018")
    Job.objects.filter(pk=job.pk).update(provider="aws", region=REGION, catalog="fc2-2018", algorithm="explore")
    job.refresh_from_db()
    specs = [profiling.cluster_spec(job, "mirrored", 1, "c4.xlarge", "") for _ in range(2)]
    for number, spec in enumerate(specs, start=1):
        entry = {"kind": "trial", "number": number, "workers": 1, "worker_type": "c4.xlarge", "strategy": "mirrored",
                 "hourly_cost": 0.199, "error": "", "record": None}  # fmt: skip
        profiling.record_run(job, entry, spec)
        profiling.keep_entry(job, entry, cluster=provisioner.launch(spec).to_dict())
    stray = provisioner.launch(profiling.cluster_spec(job, "mirrored", 1, "c4.xlarge", ""))  # recorded nowhere
    assert job.cluster["cluster_id"] == specs[1].cluster_id

    assert sweep.orphans("aws", REGION) == [stray.cluster_id]
    profiling.tear_down_stale(job)

    job.refresh_from_db()
    assert job.cluster is None and all(run["ended_at"] for run in trials.entries(job))
    assert all("lost before it measured anything" in run["error"] for run in trials.entries(job))
    assert provisioner.list_clusters("aws", REGION) == [stray.cluster_id]
    assert sweep.orphans("aws", REGION) == [stray.cluster_id]
