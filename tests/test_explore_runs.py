"""explore's trial runs for real (issue 44 §1, §4): each trial a real cluster of the job's code on the lab (network
namespaces + sshd) or on aws (moto's EC2, its instances as lab hosts), trained for FC2_EXPLORE_TRIAL_S, measured from
the chief's kept metrics.json, recorded (source trial) and torn down; the job then runs on the cluster the search
chose, its cost counting the trials. A failed trial is recorded and not tried again; a search where nothing ran
fails the job saying why; a cancel during a trial tears it down. And the door: a trial's metrics.json is the job's
own code's, checked as hostile input."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from decimal import Decimal

import pytest
from django.utils import timezone

import provisioner
from fc2.models import Job
from fc2.services import inline, jobs, pipeline, profiling, trials
from fc2.services.bundles import store_bundle
from harness.ec2lab import NOTHING, REGION, ec2, everything_tagged
from harness.wheels import GOOD, make_wheel, sleeper_wheel
from provisioner import ClusterInfo, NodeResult, lab
from provisioner.lab import net as labnet
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
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


def seconds(run: dict) -> float:
    return (datetime.fromisoformat(run["ended_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()


@LAB
@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_an_explore_job_runs_its_trials_then_the_cluster_it_chose_and_its_next_job_needs_none(
    alice, bundle, digits, settings
):
    """Two worker types × 1–3 workers, all-reduce: trials of the digits example on the lab, each recorded and torn
    down, then the job on the cluster chosen; the trials' cost is part of the job's. A second job of the workload
    plans from the first's records with fewer trials (none, once three succeeded)."""
    load_catalog("lab")
    settings.FC2_EXPLORE_TRIAL_S = 12
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


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_an_aws_explore_jobs_trial_instances_are_launched_and_terminated(ec2_hosts, alice, bundle, digits, settings):
    """One cluster to try (1 c4.xlarge worker, an m4.large PS): its trial on moto's EC2, the instances as lab hosts,
    then the job on it."""
    load_catalog("fc2-2018")
    settings.FC2_EXPLORE_TRIAL_S = 10
    request = jobs.JobRequest(
        bundle=bundle, dataset=digits, parameters=dict(PARAMETERS), provider="aws", region=REGION,
        algorithm="explore", strategy=Job.Strategy.PS, ps_type="m4.large", worker_types=["c4.xlarge"], workers=1,
        workload_name="digits-explored-aws", search_budget=Decimal("1"),
    )  # fmt: skip
    job = inline.run_inline(jobs.submit(alice, request, driver=Job.Driver.INLINE).pk)
    assert job.state == Job.State.SUCCEEDED, job.failure_reason

    (run,) = trials.entries(job)
    assert run["epoch_time_s"] and (job.worker_type, job.workers) == ("c4.xlarge", 1)
    tagged = {"Name": "tag:fc2:cluster", "Values": [run["cluster"]]}
    instances = [i for r in ec2().describe_instances(Filters=[tagged])["Reservations"] for i in r["Instances"]]
    # Launched for the trial — its PS, its chief and its worker — and terminated
    assert sorted(i["InstanceType"] for i in instances) == ["c4.xlarge", "c4.xlarge", "m4.large"]
    assert {i["State"]["Name"] for i in instances} == {"terminated"}
    assert everything_tagged(run["cluster"]) == NOTHING and everything_tagged(job.cluster_name) == NOTHING
    assert json.loads(json.dumps(job.search))["trials"] == 1
