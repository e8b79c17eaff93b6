"""EC2 on this machine, for the aws provider's tests and benchmarks: only the EC2 API is not real.

`MotoServer` runs moto's EC2 server (`moto_server`) on a free 127.0.0.1 port; boto3 reaches it through
AWS_ENDPOINT_URL. `Ec2Lab` plays the part of the hypervisor behind it: every instance moto says is running becomes a
lab host (provisioner/lab/net.py) at the very private address moto gave it, on a bridge serving the instance's subnet,
with an OpenSSH server letting in the instance's key pair (as cloud-init would) — so the provider SSHes to the
address EC2 reported, and the job trains there for real. The emulated image is this machine's, its Python (with
TensorFlow) under /root, which no other user may enter: the login user is root. An instance moto says is
terminated loses its host, processes and all. The platform is at each subnet's gateway (.1), where a relay passes
the nodes' reports to the test's report server (its "public URL").

moto has no placement groups: the tests run with FC2_AWS_PLACEMENT_GROUPS off.
"""

from __future__ import annotations

import contextlib
import ipaddress
import random
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import boto3

from provisioner.lab import net as labnet
from provisioner.lab import sshd

LOGIN_USER = "root"  # the emulated image's login user (ec2-user on Amazon Linux)
REGION = "ap-southeast-1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class MotoServer:
    """moto's server on 127.0.0.1:<free port>, its state wiped by `reset`."""

    def __init__(self, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        program = Path(sys.executable).with_name("moto_server")
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [str(program), "-H", "127.0.0.1", "-p", str(self.port)], stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1).close()
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"moto_server did not start (see {log})")

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=10).close()

    def stop(self) -> None:
        """Ends the server and reaps it (a process not waited for warns when its Popen is collected)."""
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def free_vpc_cidr() -> str:
    """A /16 under 10.128.0.0/9 that nothing on this machine uses (two test runs at once pick different ones)."""
    used = labnet._used_networks()
    candidates = list(ipaddress.ip_network("10.128.0.0/9").subnets(new_prefix=16))
    random.shuffle(candidates)
    for candidate in candidates:
        if not any(candidate.overlaps(other) for other in used):
            return str(candidate)
    raise RuntimeError("no free /16 under 10.128.0.0/9 for the emulated VPC")


def provider_environment(endpoint: str, node_dir: Path) -> dict[str, str]:
    """The environment a process needs to run the aws provider against moto at `endpoint` with its instances as
    `Ec2Lab` hosts (the tests' fixtures set the same as settings; benchmarks and Celery workers take these)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "FC2_AWS_REGION": REGION,
        "FC2_AWS_PLACEMENT_GROUPS": "false",  # moto has none
        "FC2_AWS_SSH_ADDRESS": "private",  # moto's instances have private addresses only
        "FC2_AWS_VPC_CIDR": free_vpc_cidr(),
        "FC2_AWS_SSH_USER": LOGIN_USER,
        "FC2_AWS_NODE_DIR": str(node_dir),
        "FC2_AWS_PYTHON": sys.executable,  # the emulated image's Python (with TensorFlow, as a DL AMI has)
        "FC2_PUBLIC_URL": "http://fc2-platform.invalid",  # not loopback; an Ec2Lab's gateway(0) once one is up
    }


class Ec2Lab:
    """Lab hosts for moto's running instances in `vpc_cidr`; `platform_port` relayed from every subnet's gateway."""

    def __init__(self, endpoint: str, vpc_cidr: str, platform_port: int, workdir: Path, poll_s: float = 0.2):
        import boto3

        self.ec2 = boto3.client(
            "ec2", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="t", aws_secret_access_key="t"
        )
        self.vpc = ipaddress.ip_network(vpc_cidr)
        self.platform_port = platform_port
        self.workdir = workdir
        self.tag = "ec" + secrets.token_hex(3)  # its own lab installation tag: no lab reaper ever takes its hosts
        self.poll_s = poll_s
        self.hosts: dict[str, tuple[str, int]] = {}  # instance id -> (its subnet's network name, node index)
        self.networks: dict[str, subprocess.Popen] = {}  # network name -> the relay on its gateway
        self.errors: list[str] = []
        self._next_index = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ec2lab", daemon=True)

    def gateway(self, zone_index: int = 0) -> str:
        """The platform's address on the subnet of the region's zone `zone_index` (the provider's layout)."""
        return str(list(self.vpc.subnets(new_prefix=24))[zone_index].network_address + 1)

    def __enter__(self) -> Ec2Lab:
        self.ensure_network(ipaddress.ip_network(self.gateway(0) + "/24", strict=False))
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(30)
        for relay in self.networks.values():
            relay.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                relay.wait(5)
        for name in self.networks:
            labnet.delete_cluster_network(self.tag, name)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def ensure_network(self, subnet: ipaddress.IPv4Network) -> str:
        name = f"subnet-{subnet.network_address}"
        if name not in self.networks:
            net = labnet.create_cluster_network(
                self.tag, name, [], subnet=str(subnet), platform_ports=[self.platform_port]
            )
            relay = [sys.executable, "-m", "provisioner.relay", "--listen", f"{net.gateway}:{self.platform_port}"]
            relay += ["--to", f"127.0.0.1:{self.platform_port}", "--cluster", str(self.workdir / name)]
            self.networks[name] = subprocess.Popen(relay, cwd=Path(__file__).resolve().parent.parent)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection((net.gateway, self.platform_port), 1):
                    break
                time.sleep(0.1)
        return name

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as error:  # noqa: BLE001 - kept for the test to show; the emulator goes on
                self.errors.append(repr(error))
            self._stop.wait(self.poll_s)

    def sync(self) -> None:
        """Bring the hosts in line with moto: a host for every running instance, none for any other."""
        running: dict[str, dict] = {}
        for reservation in self.ec2.describe_instances()["Reservations"]:
            for instance in reservation["Instances"]:
                address = instance.get("PrivateIpAddress")
                if instance["State"]["Name"] == "running" and address and ipaddress.ip_address(address) in self.vpc:
                    running[instance["InstanceId"]] = instance
        for instance_id, instance in running.items():
            if instance_id not in self.hosts:
                self._boot(instance)
        for instance_id in set(self.hosts) - set(running):
            name, index = self.hosts.pop(instance_id)
            labnet.remove_node(self.tag, name, index)

    def _boot(self, instance: dict) -> None:
        address = instance["PrivateIpAddress"]
        name = self.ensure_network(ipaddress.ip_network(f"{address}/24", strict=False))
        key = self.ec2.describe_key_pairs(KeyNames=[instance["KeyName"]], IncludePublicKey=True)["KeyPairs"][0]
        index, self._next_index = self._next_index, self._next_index + 1
        node = labnet.add_node(self.tag, name, index, labnet.NodeShape(address=address))
        self.hosts[instance["InstanceId"]] = (name, index)
        config = sshd.prepare(self.workdir / instance["InstanceId"], address, 22, key["PublicKey"])
        sshd.start(config, netns=node.netns)


# --- what EC2 says a cluster has, by its tag -------------------------------------------------------------------


def ec2():
    return boto3.client("ec2", region_name=REGION)


def live_instances(cluster_id: str | None = None) -> list[dict]:
    filters = [{"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}]
    if cluster_id:
        filters.append({"Name": "tag:fc2:cluster", "Values": [cluster_id]})
    return [i for r in ec2().describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


def everything_tagged(cluster_id: str) -> dict[str, list]:
    """Every kind of resource a cluster may have, as EC2 describes it by the cluster's tag."""
    client, by_tag = ec2(), [{"Name": "tag:fc2:cluster", "Values": [cluster_id]}]
    return {
        "instances": [i["InstanceId"] for i in live_instances(cluster_id)],
        "key_pairs": [k["KeyName"] for k in client.describe_key_pairs(Filters=by_tag)["KeyPairs"]],
        "security_groups": [g["GroupId"] for g in client.describe_security_groups(Filters=by_tag)["SecurityGroups"]],
        "subnets": [s["SubnetId"] for s in client.describe_subnets(Filters=by_tag)["Subnets"]],
        "gateways": [
            g["InternetGatewayId"] for g in client.describe_internet_gateways(Filters=by_tag)["InternetGateways"]
        ],
        "vpcs": [v["VpcId"] for v in client.describe_vpcs(Filters=by_tag)["Vpcs"]],
    }


NOTHING = {"instances": [], "key_pairs": [], "security_groups": [], "subnets": [], "gateways": [], "vpcs": []}
