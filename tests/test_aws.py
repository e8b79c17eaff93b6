"""The aws provider against moto's EC2 server (the only part that is not real): launch, idempotence, capacity
failover, teardown to nothing, the reaper — and, with the instances brought up as lab hosts at the addresses moto
gave them (harness/ec2lab.py), a real job bootstrapped over SSH and trained with TensorFlow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from django.core.management import call_command

import provisioner
from common import awsapi
from fc2.models import Job, ReapedCluster
from fc2.services import jobs, sweep
from fc2.services.requests import JobRequest
from harness.ec2lab import NOTHING, REGION, ec2, everything_tagged, live_instances
from provisioner import ClusterSpec, aws
from provisioner.errors import CapacityError, ProvisionError
from recommender.catalog import load_catalog
from tests.conftest import call_json

PROJECT_DIR = Path(__file__).resolve().parent.parent


def spec(name: str, workers: int = 2, strategy: str = "ps", worker_type: str = "c4.xlarge", **more) -> ClusterSpec:
    return ClusterSpec(name, "aws", strategy, workers, ps_type="m4.large", worker_type=worker_type, **more)


def test_launch_tags_every_resource_and_teardown_leaves_nothing(aws_env):
    events: list[str] = []
    cluster = aws.launch(spec("fc2-7-0a1b2c3d", job_id=7), notify=events.append)

    assert [n.name for n in cluster.nodes] == ["ps-0", "chief-0", "worker-0", "worker-1"]
    assert {n.instance_type for n in cluster.nodes} == {"m4.large", "c4.xlarge"}
    assert cluster.nodes[0].instance_type == "m4.large"  # the PS on the PS type
    made = everything_tagged("fc2-7-0a1b2c3d")
    assert len(made["instances"]) == 4 and all(made[k] for k in NOTHING)
    instances = live_instances("fc2-7-0a1b2c3d")
    assert {aws._tag(i, "fc2:job") for i in instances} == {"7"}
    assert {aws._tag(i, "fc2:installation") for i in instances} == {aws.installation()}
    assert {i["Placement"]["AvailabilityZone"] for i in instances} == {f"{REGION}a"}  # one zone
    assert {n.host for n in cluster.nodes} == {i["PrivateIpAddress"] for i in instances}  # TF_CONFIG's addresses
    assert len(events) == 4 and all("instance i-" in e for e in events)
    key = (Path(cluster.workdir) / "id_ed25519").read_bytes()
    assert b"OPENSSH PRIVATE KEY" in key and (Path(cluster.workdir) / "id_ed25519").stat().st_mode & 0o077 == 0
    with pytest.raises(TypeError, match="password"):  # encrypted at rest: useless without the platform's passphrase
        from cryptography.hazmat.primitives.serialization import load_ssh_private_key

        load_ssh_private_key(key, password=None)
    assert aws.list_clusters(REGION) == ["fc2-7-0a1b2c3d"]

    removed = provisioner.teardown("aws", "fc2-7-0a1b2c3d", REGION)
    assert everything_tagged("fc2-7-0a1b2c3d") == NOTHING
    assert sum(r.startswith("instance ") for r in removed) == 4 and any(r.startswith("vpc ") for r in removed)
    assert not Path(cluster.workdir).exists() and aws.list_clusters(REGION) == []
    assert provisioner.teardown("aws", "fc2-7-0a1b2c3d", REGION) == []  # safe twice


def test_a_second_launch_finds_the_first_and_makes_nothing_more(aws_env):
    first = aws.launch(spec("fc2-8-00000001", workers=1, strategy="mirrored"))
    again = aws.launch(spec("fc2-8-00000001", workers=1, strategy="mirrored"))
    assert [n.instance_id for n in again.nodes] == [n.instance_id for n in first.nodes]
    assert len(live_instances("fc2-8-00000001")) == 1
    assert len(everything_tagged("fc2-8-00000001")["vpcs"]) == 1


# A launch whose process is killed (SIGKILL) right after its second RunInstances was answered.
KILLED_LAUNCH = """
import os, signal, django
django.setup()
from common import awsapi
from provisioner import aws
from provisioner.types import ClusterSpec
send, made = awsapi._send, []
def send_then_die(service, region, operation, params):
    answer = send(service, region, operation, params)
    made.append(operation)
    if made.count("run_instances") == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return answer
awsapi._send = send_then_die
aws.launch(ClusterSpec("fc2-cli-killed-midway", "aws", "ps", 4, ps_type="m4.large", worker_type="c4.xlarge"))
"""


def test_a_launch_killed_midway_and_retried_makes_no_doubles(aws_env, settings):
    """A launch killed once some of its instances exist; `cluster up` of the same name then completes the cluster."""
    name = "fc2-cli-killed-midway"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "fc2.settings_test", "FC2_AWS_DIR": str(settings.FC2_AWS_DIR)}
    env |= {"FC2_AWS_PLACEMENT_GROUPS": "0", "FC2_AWS_SSH_ADDRESS": "private", "FC2_PUBLIC_URL": "http://fc2.invalid"}
    env["FC2_AWS_VPC_CIDR"] = settings.FC2_AWS_VPC_CIDR
    killed = subprocess.run([sys.executable, "-c", KILLED_LAUNCH], cwd=PROJECT_DIR, env=env, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert len(live_instances(name)) == 2, "killed midway: 2 of its 6 instances made"

    argv = [sys.executable, "manage.py", "cluster", "up", "--provider", "aws", "--region", REGION, "--no-bootstrap"]
    argv += ["--worker-type", "c4.xlarge", "--ps-type", "m4.large", "--workers", "4", "--name", name, "--json"]
    again = subprocess.run(argv, cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    instances = live_instances(name)
    assert len(out["nodes"]) == len(instances) == 6
    assert len({aws._tag(i, "fc2:node") for i in instances}) == 6  # no node twice
    assert {n["instance_id"] for n in out["nodes"]} == {i["InstanceId"] for i in instances}


def inject_capacity_shortage(monkeypatch, short: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """AWS's own InsufficientInstanceCapacity for RunInstances of (type, zone) in `short`, at the adaptor's boundary;
    returns the (type, zone) of every RunInstances tried."""
    tried: list[tuple[str, str]] = []
    send = awsapi._send

    def shortage(service, region, operation, params):
        if operation == "run_instances":
            where = (params["InstanceType"], params["Placement"]["AvailabilityZone"])
            tried.append(where)
            if where in short:
                message = f"We currently do not have sufficient {where[0]} capacity in the zone you requested"
                error = {"Error": {"Code": "InsufficientInstanceCapacity", "Message": message}}
                raise ClientError(error, "RunInstances")
        return send(service, region, operation, params)

    monkeypatch.setattr(awsapi, "_send", shortage)
    return tried


def test_a_zone_out_of_capacity_fails_over_to_the_next_with_nothing_left_behind(aws_env, monkeypatch):
    tried = inject_capacity_shortage(monkeypatch, {("c4.xlarge", f"{REGION}a")})
    events: list[str] = []
    cluster = aws.launch(spec("fc2-9-00000002", workers=2), notify=events.append)

    instances = live_instances("fc2-9-00000002")
    assert {i["Placement"]["AvailabilityZone"] for i in instances} == {f"{REGION}b"}, "the whole cluster in one zone"
    assert len(instances) == len(cluster.nodes) == 4
    assert ("c4.xlarge", f"{REGION}a") in tried and ("c4.xlarge", f"{REGION}b") in tried
    assert any(f"no capacity for c4.xlarge in {REGION}a" in e and f"trying {REGION}b" in e for e in events)


def test_no_capacity_in_any_zone_is_a_capacity_error_and_the_launch_removes_what_it_made(aws_env, monkeypatch):
    inject_capacity_shortage(monkeypatch, {("c4.xlarge", f"{REGION}{zone}") for zone in "abc"})
    with pytest.raises(CapacityError) as raised:
        aws.launch(spec("fc2-10-00000003"))
    assert raised.value.instance_type == "c4.xlarge" and len(raised.value.zones) == 3
    assert everything_tagged("fc2-10-00000003") == NOTHING


@pytest.mark.django_db
def test_the_pipeline_answers_no_capacity_with_the_recommenders_next_worker_type(aws_env, monkeypatch, job):
    """Cost-Opt picks the cheapest worker type; with none of it in the region, the next cheapest, within budget, each
    attempt on the job's timeline."""
    from fc2.services import pipeline, planning

    load_catalog("fc2-2018")
    asked = {"provider": "aws", "algorithm": "cost-opt", "budget": "2", "catalog": "fc2-2018", "ps_type": "m4.large"}
    asked |= {"worker_types": ["c4.xlarge", "t2.xlarge", "m4.xlarge"], "strategy": "ps"}
    Job.objects.filter(pk=job.pk).update(
        provider="aws", algorithm="cost-opt", budget=2, catalog="fc2-2018", state=Job.State.RECOMMENDING,
        worker_types=asked["worker_types"], request={**job.request, **asked},
    )  # fmt: skip
    job.refresh_from_db()
    pipeline._store(job, planning.plan(JobRequest.of(job), job.owner_id))
    assert job.worker_type == "c4.xlarge"  # the cheapest of L^w
    inject_capacity_shortage(monkeypatch, {("c4.xlarge", f"{REGION}{zone}") for zone in "abc"})

    assert pipeline.run_step("provision", job.pk)
    job.refresh_from_db()
    assert job.state == Job.State.PROVISIONING and job.worker_type == "t2.xlarge"  # the next cheapest
    assert job.workers == int((2 - 0.125) // 0.2336)  # n from the budget, for the new type
    assert float(job.hourly_cost) <= 2
    timeline = [e.message for e in job.events.all()]
    assert any("no capacity for c4.xlarge in any zone" in m for m in timeline)
    assert sum(f"no capacity for c4.xlarge in {REGION}" in m for m in timeline) >= 3  # each zone tried
    assert {i["InstanceType"] for i in live_instances(job.cluster_name)} == {"m4.large", "t2.xlarge"}


def test_a_region_without_the_type_or_no_credentials_is_a_clear_error_before_anything_is_made(aws_env, settings):
    with pytest.raises(ProvisionError, match=r"ap-southeast-1 does not offer p2\.xlarge"):
        aws.launch(spec("fc2-11-00000004", worker_type="p2.xlarge"))
    assert everything_tagged("fc2-11-00000004") == NOTHING and not (settings.FC2_AWS_DIR / "fc2-11-00000004").exists()

    settings.FC2_PUBLIC_URL = "http://127.0.0.1:8000"
    assert "FC2_PUBLIC_URL" in provisioner.unavailable("aws")
    settings.FC2_PUBLIC_URL = "http://fc2-platform.invalid"
    with pytest.MonkeyPatch.context() as without:  # undone before aws_env tears down what is left
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            without.delenv(name)
        without.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        without.setenv("AWS_CONFIG_FILE", "/nonexistent")
        without.setenv("AWS_EC2_METADATA_DISABLED", "true")
        assert "AWS credentials" in provisioner.unavailable("aws")
        with pytest.raises(ProvisionError, match="AWS credentials"):
            aws.launch(spec("fc2-11-00000005"))


@pytest.mark.django_db
def test_the_reaper_removes_every_kind_of_leftover_of_a_cluster_no_job_records(aws_env, job):
    """A cluster whose job is gone, half-made (a VPC, gateway, subnet, group, key and instances), is found by its
    tags and removed; a job's recorded cluster is left alone."""
    kept = aws.launch(spec(f"fc2-{job.pk}-0000beef", workers=1, strategy="mirrored"))
    Job.objects.filter(pk=job.pk).update(cluster=kept.to_dict())
    orphan = aws.launch(spec("fc2-999999-0000dead", workers=2))
    assert all(everything_tagged("fc2-999999-0000dead")[kind] for kind in NOTHING)

    reaped = sweep.reap_orphans()

    assert [(r.provider, r.cluster_name, r.job_number, r.by) for r in reaped] == [
        ("aws", "fc2-999999-0000dead", 999999, "sweep")
    ]
    assert reaped[0] == ReapedCluster.objects.get(), "what was removed is recorded"
    kinds = {line.rsplit(" ", 1)[0] for line in reaped[0].resources}
    assert {"instance", "vpc", "subnet", "internet gateway", "security group", "key pair"} <= kinds, reaped[0].resources
    assert everything_tagged("fc2-999999-0000dead") == NOTHING and not Path(orphan.workdir).exists()
    assert len(live_instances(kept.cluster_id)) == 1


@pytest.mark.django_db
def test_cluster_up_twice_is_one_cluster_and_down_leaves_no_instance(aws_env):
    def cluster(*args: str) -> dict:
        out = StringIO()
        call_command("cluster", *args, "--json", stdout=out)
        return json.loads(out.getvalue())

    up = ["up", "--provider", "aws", "--region", REGION, "--worker-type", "c4.xlarge", "--workers", "1"]
    up += ["--strategy", "mirrored", "--name", "cli-twice", "--no-bootstrap"]
    first, second = cluster(*up), cluster(*up)
    assert first["nodes"] == second["nodes"] and len(live_instances("cli-twice")) == 1
    assert [c["name"] for c in cluster("list", "--provider", "aws", "--region", REGION)["clusters"]] == ["cli-twice"]
    cluster("down", "cli-twice", "--provider", "aws", "--region", REGION)
    assert everything_tagged("cli-twice") == NOTHING


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_an_aws_job_trains_over_ssh_at_the_addresses_ec2_gave_and_leaves_nothing(ec2_hosts, alice, example_wheel):
    load_catalog("fc2-2018")
    _, result, _ = call_json(  # --wait exits 1 unless the job succeeded, after the JSON
        "submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--provider", "aws",
        "--region", REGION, "--workers", "2", "--strategy", "mirrored", "--worker-type", "c4.xlarge",
        "--param", "epochs=1", "--param", "steps_per_epoch=5", "--user", "alice", "--inline", "--wait",
    )  # fmt: skip

    assert result["status"] == "succeeded", result.get("error")
    job = Job.objects.get(pk=result["id"])
    assert {"model.keras", "metrics.json"} <= {a["name"] for a in result["artifacts"]}
    instances = {i["PrivateIpAddress"]: i for r in ec2().describe_instances()["Reservations"] for i in r["Instances"]}
    for node in job.nodes.all():
        assert node.address.split(":")[0] in instances, "the node is where EC2 said its instance is"
        assert node.started_at, "its agent reported, through the subnet's gateway"
    assert everything_tagged(job.cluster_name) == NOTHING
    assert all(i["State"]["Name"] == "terminated" for i in instances.values())


@pytest.mark.django_db
def test_a_cluster_by_hand_with_no_worker_type_is_refused_at_submit(aws_env, alice, bundle, digits):
    """EC2 has no default machine: the job is refused with the reason, before anything is queued or made."""
    request = jobs.JobRequest(bundle=bundle, dataset=digits, provider="aws", region=REGION, workers=1)
    with pytest.raises(jobs.SubmitError) as refused:
        jobs.submit(alice, request)
    assert refused.value.field == "worker_type" and "needs its worker type" in str(refused.value)
    assert not Job.objects.exists() and live_instances() == []


class PlacementGroups:
    """EC2's placement-group calls, which moto does not serve (it answers CreatePlacementGroup with HTTP 500),
    answered at the adaptor's boundary as EC2 documents them: create (a name taken is
    InvalidPlacementGroup.Duplicate), describe by tag filters, delete; every other call goes to moto."""

    def __init__(self, monkeypatch):
        self.groups: dict[str, dict] = {}
        self.run_instances: list[dict] = []
        send = awsapi._send

        def answer(service, region, operation, params):
            if operation == "create_placement_group":
                if params["GroupName"] in self.groups:
                    error = {"Code": "InvalidPlacementGroup.Duplicate", "Message": "already exists"}
                    raise ClientError({"Error": error}, "CreatePlacementGroup")
                tags = [t for spec in params.get("TagSpecifications", []) for t in spec["Tags"]]
                self.groups[params["GroupName"]] = {
                    "GroupName": params["GroupName"], "Strategy": params["Strategy"], "State": "available",
                    "Tags": tags,
                }  # fmt: skip
                return {"PlacementGroup": self.groups[params["GroupName"]]}
            if operation == "describe_placement_groups":
                return {"PlacementGroups": [g for g in self.groups.values() if self._matches(g, params)]}
            if operation == "delete_placement_group":
                if self.groups.pop(params["GroupName"], None) is None:
                    error = {"Code": "InvalidPlacementGroup.Unknown", "Message": "unknown"}
                    raise ClientError({"Error": error}, "DeletePlacementGroup")
                return {}
            if operation == "run_instances":
                self.run_instances.append(params)
            return send(service, region, operation, params)

        monkeypatch.setattr(awsapi, "_send", answer)

    @staticmethod
    def _matches(group: dict, params: dict) -> bool:
        tags = {t["Key"]: t["Value"] for t in group["Tags"]}
        return all(tags.get(f["Name"].removeprefix("tag:")) in f["Values"] for f in params.get("Filters", []))


def test_a_cluster_placement_group_holds_the_instances_where_the_types_allow_and_goes_with_the_teardown(
    aws_env, settings, monkeypatch
):
    settings.FC2_AWS_PLACEMENT_GROUPS = True
    ec2_groups = PlacementGroups(monkeypatch)
    said: list[str] = []

    cluster = aws.launch(spec("fc2-placed", workers=2), notify=said.append)
    aws.launch(spec("fc2-placed", workers=2))  # again: the group is found, not made twice

    assert list(ec2_groups.groups) == ["fc2-placed"] and ec2_groups.groups["fc2-placed"]["Strategy"] == "cluster"
    tags = {t["Key"]: t["Value"] for t in ec2_groups.groups["fc2-placed"]["Tags"]}
    assert tags["fc2:cluster"] == "fc2-placed" and tags["fc2:installation"] == aws.installation()
    assert len(ec2_groups.run_instances) == len(cluster.nodes)
    assert all(call["Placement"]["GroupName"] == "fc2-placed" for call in ec2_groups.run_instances)

    burstable = aws.launch(spec("fc2-burst", workers=1, worker_type="t2.xlarge"), notify=said.append)
    assert "fc2-burst" not in ec2_groups.groups and len(ec2_groups.run_instances) == len(cluster.nodes) + len(
        burstable.nodes
    )
    assert "no placement group: m4.large, t2.xlarge cannot be placed in one" in said
    assert "GroupName" not in ec2_groups.run_instances[-1]["Placement"]

    assert "placement group fc2-placed" in aws.teardown("fc2-placed", REGION)
    assert ec2_groups.groups == {} and everything_tagged("fc2-placed") == NOTHING
    assert aws.teardown("fc2-placed", REGION) == []  # twice: nothing left, nothing failing


def test_the_credentials_check_never_reaches_for_the_instance_metadata_address_unless_told(monkeypatch, settings):
    """Outside EC2 the link-local metadata address answers nobody (or somebody else): the check that every Resource
    page renders asks the environment and the shared files only, once per environment; FC2_AWS_INSTANCE_PROFILE=1
    (the platform on EC2 with a role) lets the chain ask the metadata service."""
    import botocore.credentials
    import botocore.utils

    settings.FC2_PUBLIC_URL = "http://fc2-platform.invalid"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, "/nonexistent")
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)
    asked: list[str] = []
    monkeypatch.setattr(
        botocore.utils.InstanceMetadataFetcher, "retrieve_iam_role_credentials", lambda self: asked.append("imds") or {}
    )
    resolves = []
    real_load = botocore.credentials.CredentialResolver.load_credentials
    monkeypatch.setattr(
        botocore.credentials.CredentialResolver,
        "load_credentials",
        lambda self: resolves.append(1) or real_load(self),
    )

    reasons = {provisioner.unavailable("aws") for _ in range(5)}

    assert len(reasons) == 1
    assert "AWS credentials" in (reason := reasons.pop()) and "FC2_AWS_INSTANCE_PROFILE=1" in reason
    assert asked == [] and len(resolves) == 1, "checked once, without the metadata address"
    monkeypatch.setenv("FC2_AWS_INSTANCE_PROFILE", "1")
    assert "AWS credentials" in provisioner.unavailable("aws")
    assert asked == ["imds"], "told it runs on EC2, the chain asks the metadata service"
