"""The `aws` provider: a job's cluster as EC2 instances, made, found and removed by their tags (FC² §4.3, §6;
Anwar §5.1: one VPC and subnet, the nodes reaching each other freely). SkyPilot's `sky/provision/aws` is the model.

Every resource of a cluster carries the tags `fc2:cluster` (its name), `fc2:installation` (this platform's, so two
installations sharing an account never touch each other's) and `fc2:job` (the job's id, when it has one). From the
name alone `launch` finds what exists and makes only what is missing, `teardown` finds and removes everything, and
`list_clusters` (the reaper's input) sees every cluster, however far its launch got:

    key pair        named after the cluster; its private half (Ed25519) is made here and kept only by the platform,
                    in FC2_AWS_DIR/<cluster>/id_ed25519, encrypted with a passphrase derived from
                    FC2_AWS_KEY_PASSPHRASE (by default from SECRET_KEY)
    network         a VPC of the cluster's own (FC2_AWS_VPC_CIDR), an internet gateway and default route, a /24
                    subnet per zone it is launched in (public addresses on launch) — or, with FC2_AWS_SUBNET_ID, an
                    existing subnet (an account's VPC quota is small: 5 per region by default)
    security group  SSH from FC2_AWS_SSH_CIDR, and everything between the cluster's own instances
    placement group `cluster` strategy, where every type of the cluster allows one (FC2_AWS_PLACEMENT_GROUPS)
    instances       one per node, tagged `fc2:node`; all of a cluster in one zone

Launch is idempotent: a retried or redelivered launch describes the instances by tag and runs only the nodes that
have none (each RunInstances with a ClientToken, so a request whose answer was lost is not made twice); a node with
two instances keeps its oldest and the others are terminated. A zone out of capacity for a type
(`CapacityError`) has what the cluster has there terminated and the whole cluster tried in the region's next
zone offering its types; when no zone has capacity the launch gives up with a CapacityError, which the pipeline
answers with the recommender's next worker type. A launch that gives up removes everything it made.

The nodes are bootstrapped over SSH like the lab's (provisioner/nodes.py): to their public address, or their private
one with FC2_AWS_SSH_ADDRESS=private (a platform inside the VPC); the nodes' private addresses are their TF_CONFIG
and their agents report to FC2_PUBLIC_URL. The machine image (FC2_AWS_AMI, else the SSM public parameter
FC2_AWS_AMI_PARAMETER: Amazon Linux 2023 by default) must have Python 3 with venv and pip; the job's wheel brings
its own dependencies (TensorFlow) from the package index — torch, on a node with no GPU (`gpus_of`), from
FC2_TORCH_INDEX_URL, PyTorch's CPU build (provisioner/nodes.py, `install_steps`). The node is the job's: its code runs
as the image's login user, with no platform secret on the machine but the job's report token.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

import paramiko
from django.conf import settings

from common.retry import retry
from provisioner import ssh
from provisioner.aws import api as awsapi
from provisioner.aws.api import call, pages
from provisioner.errors import CapacityError, ProvisionError
from provisioner.interface import Machine, NodeCommand
from provisioner.types import ClusterInfo, ClusterSpec, NodeInfo, cluster_directory, node_layout

TF_PORT = 7000  # every node is a machine of its own: one TensorFlow port is enough
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
READY_TIMEOUT_S = 900
# Families that cannot be in a `cluster` placement group (burstable types).
NO_PLACEMENT_FAMILIES = ("t1", "t2", "t3", "t3a", "t4g")


def _ignore(message: str) -> None:
    """The default `notify` of launch: nobody to tell."""


def installation() -> str:
    """This installation's tag: its own setting, else derived from its data directory."""
    return settings.FC2_AWS_INSTALLATION or hashlib.sha256(str(settings.VAR_DIR).encode()).hexdigest()[:12]


def region_of(region: str) -> str:
    return region or settings.FC2_AWS_REGION


def regions() -> list[str]:
    """Every region this installation makes clusters in (FC2_AWS_REGIONS): where the reaper looks for leftovers."""
    return list(dict.fromkeys([settings.FC2_AWS_REGION, *settings.FC2_AWS_REGIONS]))


def unavailable() -> str | None:
    if reason := awsapi.credentials_missing():
        return f"aws clusters need AWS credentials: {reason}"
    host = urlsplit(settings.FC2_PUBLIC_URL).hostname or ""
    if host == "localhost" or (_is_ip(host) and ipaddress.ip_address(host).is_loopback):
        return (
            f"aws nodes report to the platform at FC2_PUBLIC_URL ({settings.FC2_PUBLIC_URL}), which only this "
            "machine can reach: set FC2_PUBLIC_URL to the address EC2 instances reach the platform at"
        )
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _cluster_dir(cluster_id: str) -> Path:
    return cluster_directory(settings.FC2_AWS_DIR, cluster_id)


def passphrase() -> bytes:
    """What the clusters' private keys are encrypted with on the platform's disk."""
    secret = settings.FC2_AWS_KEY_PASSPHRASE or settings.SECRET_KEY
    digest = hashlib.pbkdf2_hmac("sha256", secret.encode(), b"fc2 aws cluster ssh key", 100_000)
    return base64.b64encode(digest)


def _own(cluster_id: str | None = None) -> list[dict]:
    """Filters that find this installation's resources (of one cluster, when given)."""
    found = [{"Name": "tag:fc2:installation", "Values": [installation()]}]
    if cluster_id is not None:
        found.append({"Name": "tag:fc2:cluster", "Values": [cluster_id]})
    return found


def _tags(spec: ClusterSpec, **more: str) -> list[dict[str, str]]:
    values = {"fc2:cluster": spec.cluster_id, "fc2:installation": installation(), "Name": spec.cluster_id, **more}
    if spec.job_id:
        values["fc2:job"] = str(spec.job_id)
    return [{"Key": key, "Value": value} for key, value in values.items()]


def _tag_spec(kind: str, spec: ClusterSpec, **more: str) -> list[dict]:
    return [{"ResourceType": kind, "Tags": _tags(spec, **more)}]


def _tag(resource: dict, key: str) -> str:
    return next((tag["Value"] for tag in resource.get("Tags") or [] if tag["Key"] == key), "")


NodeTypes = list[tuple[str, int, str]]  # each node's role, index and instance type


def _node_types(spec: ClusterSpec) -> NodeTypes:
    if not spec.worker_type:
        raise ProvisionError("an aws cluster needs a worker instance type")
    ps_type = spec.ps_type or spec.worker_type
    return [
        (role, index, ps_type if role == "ps" else spec.worker_type)
        for role, index in node_layout(spec.strategy, spec.workers)
    ]


def zones_offering(region: str, types: set[str]) -> list[str]:
    """The region's zones where every one of `types` is offered, in name order; a clear error, before anything is
    made, for a region that does not exist or a type the region does not have."""
    available = pages(
        "ec2",
        region,
        "describe_availability_zones",
        "AvailabilityZones",
        Filters=[{"Name": "state", "Values": ["available"]}],
    )
    zones = sorted(
        zone["ZoneName"] for zone in available if zone.get("ZoneType", "availability-zone") == "availability-zone"
    )
    if not zones:
        raise ProvisionError(f"AWS region {region} has no available zone")
    offers = pages(
        "ec2",
        region,
        "describe_instance_type_offerings",
        "InstanceTypeOfferings",
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": sorted(types)}],
    )
    where: dict[str, set[str]] = {t: set() for t in types}
    for offer in offers:
        where.setdefault(offer["InstanceType"], set()).add(offer["Location"])
    missing = sorted(t for t in types if not where[t])
    if missing:
        raise ProvisionError(f"AWS region {region} does not offer {', '.join(missing)}")
    usable = [zone for zone in zones if all(zone in where[t] for t in types)]
    if not usable:
        raise ProvisionError(f"no zone of AWS region {region} offers all of {', '.join(sorted(types))}")
    return usable


def launch(spec: ClusterSpec, notify: Callable[[str], None] = _ignore) -> ClusterInfo:
    """Make the cluster's instances (and what they need) or find them; see the module's docstring."""
    if reason := unavailable():
        raise ProvisionError(reason)
    region = region_of(spec.region)
    nodes_of = _node_types(spec)
    types = {instance_type for _, _, instance_type in nodes_of}
    zones = zones_offering(region, types)
    workdir = _cluster_dir(spec.cluster_id)
    try:
        workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (workdir / "logs").mkdir(exist_ok=True)
        public_key = ssh.generate_keypair(workdir / "id_ed25519", f"fc2-{spec.cluster_id}", passphrase())
        _ensure_key_pair(region, spec, public_key)
        network = _Network(region, spec)
        if network.fixed_zone:
            zones = [zone for zone in zones if zone == network.fixed_zone]
            if not zones:
                raise ProvisionError(f"subnet {settings.FC2_AWS_SUBNET_ID}'s zone does not offer {', '.join(types)}")
        group = _ensure_security_group(region, spec, network.vpc_id)
        placement = _ensure_placement_group(region, spec, types, notify)
        image = _image(region)
        instances = _launch_in_some_zone(region, spec, nodes_of, zones, network, group, placement, image, notify)
        ids = [instance["InstanceId"] for instance in instances.values()]
        awsapi.wait(region, "instance_running", timeout_s=READY_TIMEOUT_S, InstanceIds=ids)
        awsapi.wait(region, "instance_status_ok", timeout_s=READY_TIMEOUT_S, InstanceIds=ids)
        gpus = gpus_of(region, types)
        cluster = _cluster_info(spec, region, workdir, nodes_of, _instances(region, spec.cluster_id), gpus)
        cluster.save(workdir)
        return cluster
    except BaseException:
        teardown(spec.cluster_id, region)
        raise


def _ensure_key_pair(region: str, spec: ClusterSpec, public_key: str) -> None:
    found = pages("ec2", region, "describe_key_pairs", "KeyPairs", Filters=_own(spec.cluster_id))
    if found:
        return
    call(
        "ec2",
        region,
        "import_key_pair",
        KeyName=spec.cluster_id,
        PublicKeyMaterial=public_key.encode(),
        TagSpecifications=_tag_spec("key-pair", spec),
    )


class _Network:
    """The cluster's VPC and its subnets by zone: its own, or the operator's subnet (FC2_AWS_SUBNET_ID)."""

    def __init__(self, region: str, spec: ClusterSpec):
        self.region, self.spec = region, spec
        self.fixed_zone = ""
        self._subnets: dict[str, str] = {}
        if settings.FC2_AWS_SUBNET_ID:
            subnet = call("ec2", region, "describe_subnets", SubnetIds=[settings.FC2_AWS_SUBNET_ID])["Subnets"][0]
            self.vpc_id, self.fixed_zone = subnet["VpcId"], subnet["AvailabilityZone"]
            self._subnets[self.fixed_zone] = subnet["SubnetId"]
        else:
            self.vpc_id = self._ensure_vpc()

    def _ensure_vpc(self) -> str:
        region, spec = self.region, self.spec
        found = pages("ec2", region, "describe_vpcs", "Vpcs", Filters=_own(spec.cluster_id))
        if found:
            vpc_id = found[0]["VpcId"]
        else:
            vpc = call(
                "ec2",
                region,
                "create_vpc",
                CidrBlock=settings.FC2_AWS_VPC_CIDR,
                TagSpecifications=_tag_spec("vpc", spec),
            )["Vpc"]
            vpc_id = vpc["VpcId"]
        gateways = pages("ec2", region, "describe_internet_gateways", "InternetGateways", Filters=_own(spec.cluster_id))
        if gateways:
            gateway = gateways[0]
        else:
            gateway = call(
                "ec2", region, "create_internet_gateway", TagSpecifications=_tag_spec("internet-gateway", spec)
            )["InternetGateway"]
        if not any(a.get("VpcId") == vpc_id for a in gateway.get("Attachments") or []):
            call("ec2", region, "attach_internet_gateway", InternetGatewayId=gateway["InternetGatewayId"], VpcId=vpc_id)
        tables = pages(
            "ec2",
            region,
            "describe_route_tables",
            "RouteTables",
            Filters=[{"Name": "vpc-id", "Values": [vpc_id]}, {"Name": "association.main", "Values": ["true"]}],
        )
        for table in tables:
            if not any(route.get("DestinationCidrBlock") == "0.0.0.0/0" for route in table.get("Routes", [])):
                call(
                    "ec2",
                    region,
                    "create_route",
                    RouteTableId=table["RouteTableId"],
                    DestinationCidrBlock="0.0.0.0/0",
                    GatewayId=gateway["InternetGatewayId"],
                )
        return vpc_id

    def subnet(self, zone: str) -> str:
        """The cluster's subnet in `zone` (made when it has none): the VPC's i-th /24 for the zone lettered i."""
        if zone in self._subnets:
            return self._subnets[zone]
        region, spec = self.region, self.spec
        found = pages(
            "ec2",
            region,
            "describe_subnets",
            "Subnets",
            Filters=[*_own(spec.cluster_id), {"Name": "availability-zone", "Values": [zone]}],
        )
        if found:
            subnet_id = found[0]["SubnetId"]
        else:
            vpc_net = ipaddress.ip_network(settings.FC2_AWS_VPC_CIDR)
            index = ord(zone[-1]) - ord("a")  # ap-southeast-1a -> 0
            cidr = str(list(vpc_net.subnets(new_prefix=24))[index]) if vpc_net.prefixlen <= 24 else str(vpc_net)
            subnet_id = call(
                "ec2",
                region,
                "create_subnet",
                VpcId=self.vpc_id,
                CidrBlock=cidr,
                AvailabilityZone=zone,
                TagSpecifications=_tag_spec("subnet", spec),
            )["Subnet"]["SubnetId"]
            call("ec2", region, "modify_subnet_attribute", SubnetId=subnet_id, MapPublicIpOnLaunch={"Value": True})
        self._subnets[zone] = subnet_id
        return subnet_id


def _ensure_security_group(region: str, spec: ClusterSpec, vpc_id: str) -> str:
    found = pages("ec2", region, "describe_security_groups", "SecurityGroups", Filters=_own(spec.cluster_id))
    if found:
        return found[0]["GroupId"]
    group_id = call(
        "ec2",
        region,
        "create_security_group",
        GroupName=spec.cluster_id,
        Description=f"FC2 cluster {spec.cluster_id}: SSH from the platform, everything between its nodes",
        VpcId=vpc_id,
        TagSpecifications=_tag_spec("security-group", spec),
    )["GroupId"]
    call(
        "ec2",
        region,
        "authorize_security_group_ingress",
        GroupId=group_id,
        IpPermissions=[
            {
                "IpProtocol": "tcp",
                "FromPort": 22,
                "ToPort": 22,
                "IpRanges": [{"CidrIp": settings.FC2_AWS_SSH_CIDR, "Description": "SSH from the platform"}],
            },
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id, "Description": "the cluster's nodes"}]},
        ],
    )
    return group_id


def _ensure_placement_group(region: str, spec: ClusterSpec, types: set[str], notify: Callable[[str], None]) -> str:
    """The cluster's `cluster` placement group, or "" where its types allow none or placement groups are off."""
    if not settings.FC2_AWS_PLACEMENT_GROUPS:
        return ""
    if any(t.split(".")[0] in NO_PLACEMENT_FAMILIES for t in types):
        notify(f"no placement group: {', '.join(sorted(types))} cannot be placed in one")
        return ""
    found = pages("ec2", region, "describe_placement_groups", "PlacementGroups", Filters=_own(spec.cluster_id))
    if not found:
        call(
            "ec2",
            region,
            "create_placement_group",
            GroupName=spec.cluster_id,
            Strategy="cluster",
            TagSpecifications=_tag_spec("placement-group", spec),
        )
    return spec.cluster_id


def _image(region: str) -> str:
    if settings.FC2_AWS_AMI:
        return settings.FC2_AWS_AMI
    name = settings.FC2_AWS_AMI_PARAMETER
    try:
        return call("ssm", region, "get_parameter", Name=name)["Parameter"]["Value"]
    except awsapi.AwsError as error:
        raise ProvisionError(
            f"cannot look up the machine image ({name} in {region}): {error}; set FC2_AWS_AMI"
        ) from error


def _instances(region: str, cluster_id: str, states: list[str] | None = None) -> list[dict]:
    reservations = pages(
        "ec2",
        region,
        "describe_instances",
        "Reservations",
        Filters=[*_own(cluster_id), {"Name": "instance-state-name", "Values": states or LIVE_STATES}],
    )
    return [instance for reservation in reservations for instance in reservation["Instances"]]


def _terminate(region: str, ids: list[str], *, wait: bool = True) -> None:
    if not ids:
        return
    call("ec2", region, "terminate_instances", InstanceIds=ids)
    if wait:
        awsapi.wait(region, "instance_terminated", timeout_s=READY_TIMEOUT_S, InstanceIds=ids)


def _launch_in_some_zone(
    region: str,
    spec: ClusterSpec,
    nodes_of: NodeTypes,
    zones: list[str],
    network: _Network,
    group: str,
    placement: str,
    image: str,
    notify: Callable[[str], None],
) -> dict[str, dict]:
    """Every node's instance, all in one zone: where the cluster already has instances first, then the others."""
    present = {instance["Placement"]["AvailabilityZone"] for instance in _instances(region, spec.cluster_id)}
    ordered = sorted(zones, key=lambda zone: zone not in present)
    failures: list[str] = []
    for number, zone in enumerate(ordered):
        try:
            return _ensure_instances(region, spec, nodes_of, zone, network, group, placement, image, notify)
        except CapacityError as error:
            failures.append(zone)
            rest = ordered[number + 1 :]
            notify(f"{error}; " + (f"trying {rest[0]}" if rest else "no other zone of the region has its types"))
            _terminate(region, [i["InstanceId"] for i in _instances(region, spec.cluster_id)])
            last = error
    raise CapacityError(
        f"no capacity for {last.instance_type} in any zone of {region} ({', '.join(failures)})",
        last.instance_type,
        tuple(failures),
    )


def _ensure_instances(
    region: str,
    spec: ClusterSpec,
    nodes_of: NodeTypes,
    zone: str,
    network: _Network,
    group: str,
    placement: str,
    image: str,
    notify: Callable[[str], None],
) -> dict[str, dict]:
    """Node name -> its instance in `zone`: found by tag, run for the nodes that have none, duplicates terminated."""
    wanted = {f"{role}-{index}": instance_type for role, index, instance_type in nodes_of}
    by_node: dict[str, list[dict]] = {}
    for instance in _instances(region, spec.cluster_id):
        by_node.setdefault(_tag(instance, "fc2:node"), []).append(instance)
    extra = []
    for name, instances in by_node.items():
        instances.sort(key=lambda i: (i["LaunchTime"], i["InstanceId"]))
        keep = name in wanted and instances[0]["Placement"]["AvailabilityZone"] == zone
        extra += instances[1:] if keep else instances
        by_node[name] = instances[:1] if keep else []
    if extra:
        notify(
            f"{len(extra)} instance(s) more than the cluster's nodes, terminated: "
            + ", ".join(i["InstanceId"] for i in extra)
        )
        _terminate(region, [i["InstanceId"] for i in extra], wait=False)
    # A ClientToken per node and launch generation: a request retried after its answer was lost returns the same
    # instance, and a node whose instance was terminated (another zone tried) gets a new one.
    generation = len(_instances(region, spec.cluster_id, ["shutting-down", "terminated"]))
    found = {name: instances[0] for name, instances in by_node.items() if instances}
    for name, instance_type in wanted.items():
        if name in found:
            continue
        # (spot or not: a launch that fell back to on-demand is another request than the spot one)
        market = "spot" if spec.spot else ""
        token = hashlib.sha256(f"{spec.cluster_id}/{name}/{zone}/{generation}{market}".encode()).hexdigest()[:64]
        placement_params = {"AvailabilityZone": zone, **({"GroupName": placement} if placement else {})}
        response = _run_instance(
            region,
            spec,
            zone,
            ImageId=image,
            InstanceType=instance_type,
            MinCount=1,
            MaxCount=1,
            KeyName=spec.cluster_id,
            ClientToken=token,
            Placement=placement_params,
            NetworkInterfaces=[
                {
                    "DeviceIndex": 0,
                    "SubnetId": network.subnet(zone),
                    "Groups": [group],
                    "AssociatePublicIpAddress": settings.FC2_AWS_SSH_ADDRESS == "public",
                    "DeleteOnTermination": True,
                }
            ],
            TagSpecifications=[
                *_tag_spec("instance", spec, **{"fc2:node": name, "Name": f"{spec.cluster_id}-{name}"}),
                *_tag_spec("volume", spec, **{"fc2:node": name}),
            ],
        )
        found[name] = response["Instances"][0]
        notify(f"{name}: {instance_type} instance {found[name]['InstanceId']} in {zone}")
    return found


def replace_nodes(cluster_id: str, region: str, nodes: list[NodeInfo]) -> list[str]:
    """Remove the instances of these nodes of the cluster (a managed job's lost nodes: terminated, spot-interrupted,
    cut off), so that its next launch runs new ones in their place; returns the ids of those that were still there.
    Their host keys are forgotten: a new instance may be given a lost one's address, with a key of its own."""
    region = region_of(region)
    live = {instance["InstanceId"] for instance in _instances(region, cluster_id)}
    ids = [node.instance_id for node in nodes if node.instance_id in live]
    _terminate(region, ids)
    known_hosts = _cluster_dir(cluster_id) / "known_hosts"
    if known_hosts.exists():
        keys = paramiko.HostKeys(str(known_hosts))
        for node in nodes:
            for name in (node.external_host, f"[{node.external_host}]:{node.ssh_port}"):
                if name in keys:
                    del keys[name]
        keys.save(str(known_hosts))
    return ids


# What EC2 answers a spot request it cannot fill at the price or count asked: as no capacity for the type there.
SPOT_UNAVAILABLE = ("SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded", "InsufficientSpotInstanceCapacity")


def market_options(spec: ClusterSpec) -> dict:
    """RunInstances' parameters for the cluster's market: every instance terminates when it shuts itself down (its
    agent does, once the platform has been silent to it too long: FC2_NODE_ORPHAN_S), so that nothing stays billed;
    a spot cluster's are one-time spot instances, terminated when EC2 takes them back, at most at its max price."""
    options: dict = {"InstanceInitiatedShutdownBehavior": "terminate"}
    if spec.spot:
        spot: dict = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if spec.spot_max_price is not None:
            spot["MaxPrice"] = f"{spec.spot_max_price:.4f}"
        options["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
    return options


def _run_instance(region: str, spec: ClusterSpec, zone: str, **params: object) -> dict:
    """RunInstances of one node in its market; a spot request EC2 cannot fill there is a CapacityError, as a zone
    out of the type is."""
    try:
        return call("ec2", region, "run_instances", **params, **market_options(spec))
    except awsapi.AwsError as error:
        if spec.spot and error.code in SPOT_UNAVAILABLE:
            instance_type = str(params.get("InstanceType", ""))
            raise CapacityError(
                f"no spot capacity for {instance_type} in {zone}: {error}", instance_type, (zone,)
            ) from None
        raise


def gpus_of(region: str, types: set[str]) -> dict[str, int]:
    """Instance type -> how many GPUs it has, as EC2 describes it (a PyTorch node runs one process per GPU, and a node
    with none gets torch's CPU build)."""
    described = pages("ec2", region, "describe_instance_types", "InstanceTypes", InstanceTypes=sorted(types))
    return {
        item["InstanceType"]: sum(gpu.get("Count", 0) for gpu in (item.get("GpuInfo") or {}).get("Gpus", []))
        for item in described
    }


def _cluster_info(
    spec: ClusterSpec, region: str, workdir: Path, nodes_of: NodeTypes, instances: list[dict], gpus: dict[str, int]
) -> ClusterInfo:
    by_node = {_tag(instance, "fc2:node"): instance for instance in instances}
    user = settings.FC2_AWS_SSH_USER
    nodes = []
    for role, index, instance_type in nodes_of:
        name = f"{role}-{index}"
        instance = by_node.get(name)
        if instance is None:
            raise ProvisionError(f"node {name}'s instance disappeared while the cluster was launched")
        private = instance.get("PrivateIpAddress", "")
        external = private if settings.FC2_AWS_SSH_ADDRESS == "private" else instance.get("PublicIpAddress", "")
        if not external:
            raise ProvisionError(
                f"node {name} ({instance['InstanceId']}) has no public address to reach it at over SSH: "
                "give its subnet public addresses, or set FC2_AWS_SSH_ADDRESS=private for a platform inside the VPC"
            )
        nodes.append(
            NodeInfo(
                name=name,
                role=role,
                index=index,
                host=private,
                port=TF_PORT,
                instance_type=instance_type,
                instance_id=instance["InstanceId"],
                external_host=external,
                ssh_port=22,
                ssh_user=user,
                workdir=f"{settings.FC2_AWS_NODE_DIR.format(user=user)}/{spec.cluster_id}/{name}",
                gpus=gpus.get(instance_type, 0),
            )
        )
    return ClusterInfo(
        cluster_id=spec.cluster_id,
        provider="aws",
        strategy=spec.strategy,
        nodes=tuple(nodes),
        workdir=str(workdir),
        region=region,
    )


def machine(cluster: ClusterInfo, node: NodeInfo) -> Machine:
    return Machine(
        runner=ssh.cluster_runner(Path(cluster.workdir), node, passphrase()),
        host=node.external_host,
        root=node.workdir,
        python=settings.FC2_AWS_PYTHON,
        install_dir=node.workdir,
    )


def node_command(cluster: ClusterInfo, node: NodeInfo, argv: list[str], dataset: str) -> NodeCommand:
    """The node's command as the machine's login user: the machine is the job's own."""
    work, output = f"{node.workdir}/job/work", f"{node.workdir}/job/output"
    return NodeCommand(tuple(argv), dataset, output, work, output, work)


def report_url(cluster: ClusterInfo, url: str) -> str:
    """The nodes reach the platform at its public URL (FC2_PUBLIC_URL), whatever address it reaches itself at (an
    `--inline` run's private port on 127.0.0.1 is no address for EC2): any of the platform's servers takes reports."""
    return settings.FC2_PUBLIC_URL


def get_cluster(cluster_id: str, region: str = "") -> ClusterInfo | None:
    return ClusterInfo.load(_cluster_dir(cluster_id))


def list_clusters(region: str = "") -> list[str]:
    """Every cluster of this installation that has anything left in the region, however far its launch got."""
    region = region_of(region)
    found: set[str] = set()
    for operation, key in [("describe_instances", "Reservations"), *((k.describe, k.key) for k in _KINDS)]:
        for item in _described(region, operation, key, None):
            found.add(_tag(item, "fc2:cluster"))
    found.discard("")
    return sorted(found)


class _Kind(NamedTuple):
    """A kind of resource a cluster may have besides its instances: how it is described, named and removed."""

    label: str  # as teardown reports it: "<label> <id>"
    describe: str
    key: str  # of its items in the describe answer
    delete: str
    id_field: str  # the item's field the delete takes (as the same parameter)


# What a cluster may have besides its instances, in the order teardown removes it (after the instances).
_KINDS = (
    _Kind("placement group", "describe_placement_groups", "PlacementGroups", "delete_placement_group", "GroupName"),
    _Kind("key pair", "describe_key_pairs", "KeyPairs", "delete_key_pair", "KeyName"),
    _Kind("security group", "describe_security_groups", "SecurityGroups", "delete_security_group", "GroupId"),
    _Kind("subnet", "describe_subnets", "Subnets", "delete_subnet", "SubnetId"),
    _Kind(
        "internet gateway",
        "describe_internet_gateways",
        "InternetGateways",
        "delete_internet_gateway",
        "InternetGatewayId",
    ),  # fmt: skip
    _Kind("vpc", "describe_vpcs", "Vpcs", "delete_vpc", "VpcId"),
)


def _described(region: str, operation: str, key: str, cluster_id: str | None) -> list[dict]:
    if operation == "describe_placement_groups" and not settings.FC2_AWS_PLACEMENT_GROUPS:
        return []
    filters = _own(cluster_id)
    if operation == "describe_instances":
        filters.append({"Name": "instance-state-name", "Values": LIVE_STATES})
        return [i for r in pages("ec2", region, operation, key, Filters=filters) for i in r["Instances"]]
    return pages("ec2", region, operation, key, Filters=filters)  # (an unpaginated answer is one page)


def teardown(cluster_id: str, region: str = "") -> list[str]:
    """Remove everything of the cluster, found by its tags; returns what was removed. Safe twice, safe on a
    half-made cluster: it needs nothing but the cluster's name."""
    region = region_of(region)
    removed: list[str] = []
    instances = _described(region, "describe_instances", "Reservations", cluster_id)
    ids = [instance["InstanceId"] for instance in instances]
    _terminate(region, ids)
    removed += [f"instance {i}" for i in ids]
    for kind in _KINDS:
        for item in _described(region, kind.describe, kind.key, cluster_id):
            ident = item[kind.id_field]
            for attachment in item.get("Attachments") or []:  # a gateway is detached from its VPC first
                vpc = attachment["VpcId"]
                _quietly(call, "ec2", region, "detach_internet_gateway", InternetGatewayId=ident, VpcId=vpc)
            _quietly(call, "ec2", region, kind.delete, **{kind.id_field: ident})
            removed.append(f"{kind.label} {ident}")
    shutil.rmtree(_cluster_dir(cluster_id), ignore_errors=True)
    return removed


GONE = (".NotFound", ".Unknown", "NotAttached")
DEPENDENCY_WAIT_S = 120


def _quietly(function: Callable[..., object], *args: object, **kwargs: object) -> None:
    """A removal whose target is already gone is done; one whose target is still in use (a security group whose
    instances' network interfaces are still being released) is tried again every 2 s for a while."""
    try:
        retry(
            lambda: function(*args, **kwargs),
            retryable=lambda error: isinstance(error, awsapi.AwsError) and error.code == "DependencyViolation",
            attempts=None,
            timeout_s=DEPENDENCY_WAIT_S,
            first_delay_s=2,
            max_delay_s=2,
            what="an AWS removal still in use",
        )
    except awsapi.AwsError as error:
        if not error.code.endswith(GONE):
            raise
