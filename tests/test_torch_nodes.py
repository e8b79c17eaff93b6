"""PyTorch nodes (issue 46), through the provisioner alone: torchrun's variables on every node, a GPU node's command
through torch.distributed.run, DDP's gloo inside the sandbox, torch's CPU build installed from the machine image or
from PyTorch's CPU index, and a 2-worker DDP run on `local`, `lab` and `aws` (moto's instances as lab hosts).

The DDP code below is written the way PyTorch's tutorials write it for `torchrun` — `init_process_group(backend,
init_method="env://")`, DistributedDataParallel, no FC2_* anywhere — so a run passing means code written for torchrun
by someone else runs here unchanged.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import provisioner
from harness.wheels import DIST_INFO, GOOD, make_wheel
from provisioner import ClusterInfo, ClusterSpec, NodeInfo, ProvisionError, RunSpec, local, sandbox
from provisioner.interface import AGENT_FILES, NodeCommand
from provisioner.nodes import MONITOR_DIR, install_steps, node_argv, node_environment, torch_requirement
from tests.helpers import wait_result

# A torchrun script as its tutorials write it: each rank trains the same model on data of its own; DDP all-reduces
# the gradients, so every rank ends with the same weights, and an all_reduce of rank + 1 sums to W(W+1)/2.
DDP_SCRIPT = """
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(5):
        loss = model(torch.randn(16, 4, generator=generator) + rank).pow(2).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    weights = [round(w, 6) for w in model.module.weight.detach().flatten().tolist()]
    print("DDP " + json.dumps({"rank": rank, "world": world, "sum": total.item(), "weights": weights}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""
# Beside the script, in the same process once DDP has trained: a DataLoader with worker processes and a
# DistributedSampler as the tutorials feed DDP (fork, tensors through /dev/shm, descriptors over AF_UNIX), then what the
# sandbox's filter refuses (provisioner/seccomp.py), which torch and gloo being loaded must not change.
PROBE = """
import ctypes, errno, json, socket

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from demo.main import main

main()
data = TensorDataset(torch.arange(64, dtype=torch.float32))
sampler = DistributedSampler(data, num_replicas=2, rank=0)
seen = sum(len(batch[0]) for batch in DataLoader(data, batch_size=8, sampler=sampler, num_workers=2))
libc = ctypes.CDLL(None, use_errno=True)
refused = {}
for name, number, args in [("unshare(CLONE_NEWUSER)", 272, (0x10000000,)), ("ptrace", 101, (0, 1, 0, 0))]:
    ctypes.set_errno(0)
    refused[name] = errno.errorcode.get(ctypes.get_errno(), "ok") if libc.syscall(number, *args) == -1 else "ok"
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    refused["socket(AF_VSOCK)"] = "ok"
except OSError as error:
    refused["socket(AF_VSOCK)"] = errno.errorcode[error.errno]
print("PROBE " + json.dumps({"loaded": seen, "refused": refused}), flush=True)
"""
TORCH_METADATA = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nRequires-Dist: torch\n"


def ddp_wheel(directory: Path) -> Path:
    """The torchrun script as a bundle that asks for torch, as a PyTorch bundle's metadata does."""
    members = {**GOOD, "demo/main.py": DDP_SCRIPT.encode(), "demo/probe.py": PROBE.encode()}
    members[f"{DIST_INFO}/METADATA"] = TORCH_METADATA
    return make_wheel(directory, members)


def ddp_run(directory: Path, module: str = "demo.main") -> RunSpec:
    """The torchrun script's run, its dataset a file the script never reads (the bootstrap copies one to each node)."""
    data = directory / "data.npz"
    np.savez(data, x=np.zeros(4))
    return RunSpec(1, str(ddp_wheel(directory)), module, dataset=str(data), framework="pytorch")


def cluster_of(workers: int, gpus: int = 0, host: str = "10.0.0.{}") -> ClusterInfo:
    nodes = tuple(
        NodeInfo(f"worker-{i}", "worker", i, host.format(i + 2), 7000, instance_type="t", gpus=gpus)
        for i in range(workers)
    )
    return ClusterInfo("fc2-torch", "aws", "ddp", nodes)


COMMAND = NodeCommand(("python",), "/job/data/d.npz", "/job/output", "/job/work", "/o", "/w")
TORCH_RUN = RunSpec(1, "demo-1.0-py3-none-any.whl", "demo.main", args=("--epochs=2",), framework="pytorch")


def test_every_cpu_node_gets_torchruns_variables_and_no_tf_config():
    cluster = cluster_of(3)
    envs = [node_environment(cluster, node, COMMAND, TORCH_RUN, interface="eth0") for node in cluster.nodes]
    for rank, env in enumerate(envs):
        assert "TF_CONFIG" not in env and not any(name.startswith("TORCHELASTIC") for name in env)
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.2", "7000")  # worker 0, as TF_CONFIG names it
        assert env["RANK"] == env["GROUP_RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["GROUP_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "3"
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["ROLE_NAME"]) == ("0", "1", "default")
        assert (env["FC2_DIST_BACKEND"], env["GLOO_SOCKET_IFNAME"]) == ("gloo", "eth0")
        assert env["FC2_IS_CHIEF"] == ("1" if rank == 0 else "0") and env["FC2_STRATEGY"] == "ddp"
        assert env["FC2_OUTPUT_DIR"] == "/job/output" and env["FC2_DATA"] == "/job/data/d.npz"
    # A TensorFlow run on the same cluster still gets TF_CONFIG and none of torchrun's.
    tf = node_environment(cluster, cluster.nodes[1], COMMAND, RunSpec(1, "w.whl", "demo.main"))
    assert json.loads(tf["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}
    assert not {"MASTER_ADDR", "RANK", "WORLD_SIZE", "FC2_DIST_BACKEND"} & set(tf)


def test_a_node_sharing_its_machine_runs_as_many_threads_as_its_cpu_share():
    """A lab host capped at 1 CPU is told so (torch would start a thread per core of the machine); a node with a
    machine of its own is left torch's default."""
    shared = ClusterInfo("fc2-torch", "lab", "ddp", tuple(replace(node, cpus=1) for node in cluster_of(2).nodes))
    assert [node_environment(shared, node, COMMAND, TORCH_RUN)["OMP_NUM_THREADS"] for node in shared.nodes] == ["1"] * 2
    own = cluster_of(2)
    assert not any("OMP_NUM_THREADS" in node_environment(own, node, COMMAND, TORCH_RUN) for node in own.nodes)


def test_a_gpu_node_runs_one_process_per_gpu_through_torch_distributed_run_on_nccl():
    cluster = cluster_of(2, gpus=4)
    node = cluster.nodes[1]
    argv = node_argv(cluster, node, TORCH_RUN, "/env/bin/python", "/n/worker-1")
    assert argv == [
        "/env/bin/python", "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "4",
        "--node-rank", "1", "--master-addr", "10.0.0.2", "--master-port", "7000",
        "/n/worker-1/fc2_launcher.py", "demo.main", "--epochs=2",
    ]  # fmt: skip
    env = node_environment(cluster, node, COMMAND, TORCH_RUN, interface="ens5")
    assert (env["FC2_DIST_BACKEND"], env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == ("nccl", "ens5", "ens5")
    # The per-process ranks are torch.distributed.run's to give: none at the node's level to contradict them.
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"} & set(env)
    # A CPU node runs the module through the launcher itself; a TensorFlow node runs it with python -m.
    cpu = cluster_of(2)
    launched = ["py", "/n/fc2_launcher.py", "demo.main", "--epochs=2"]
    assert node_argv(cpu, cpu.nodes[1], TORCH_RUN, "py", "/n") == launched
    assert node_argv(cluster, node, RunSpec(1, "w.whl", "demo.main"), "py", "/n") == ["py", "-m", "demo.main"]


@pytest.mark.heavy
def test_torch_distributed_run_starts_each_process_of_a_gpu_node_through_the_launcher(tmp_path):
    """A GPU node's command as the bootstrap builds it, run here on CPU (the script takes gloo without CUDA): the
    torchrun script, unchanged, in 2 processes that torch.distributed.run starts through the launcher from the node's
    directory, each given its rank; both train together and exit 0."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    node = NodeInfo("worker-0", "worker", 0, "127.0.0.1", port, gpus=2)
    cluster = ClusterInfo("fc2-torch-run", "aws", "ddp", (node,))
    root, work = tmp_path / "node", tmp_path / "work"
    (work / "demo").mkdir(parents=True)
    (work / "demo" / "__init__.py").write_text("")
    (work / "demo" / "main.py").write_text(DDP_SCRIPT)
    root.mkdir()
    shutil.copy(MONITOR_DIR / "launcher.py", root / AGENT_FILES["launcher.py"])
    argv = node_argv(cluster, node, RunSpec(1, "w.whl", "demo.main", framework="pytorch"), sys.executable, str(root))
    env = {**node_environment(cluster, node, COMMAND, TORCH_RUN), "HOME": str(work), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # The processes share torch.distributed.run's stdout: their lines may come through mixed.
    assert_trained_together([json.loads(line) for line in re.findall(r"DDP (\{[^{}]*\})", done.stdout)], 2)


@pytest.mark.parametrize(
    ("strategy", "framework", "reason"),
    [
        ("ps", "pytorch", "its strategy must be ddp"),
        ("ddp", "jax", "unknown framework 'jax'"),
    ],
)
def test_a_framework_the_nodes_cannot_be_told_their_cluster_for_is_refused_before_anything_runs(
    strategy, framework, reason
):
    cluster = ClusterInfo("fc2-refused", "local", strategy, nodes=())
    with pytest.raises(ProvisionError, match=reason):
        provisioner.bootstrap(cluster, RunSpec(1, "w.whl", "demo.main", framework=framework))


# FC2_TORCH_INDEX_URL where nothing answers: an install that reached for the index would fail.
NO_INDEX = "http://127.0.0.1:9/simple"


def installed(env: Path) -> set[str]:
    """The distributions installed into a job's env itself (not those it sees of the machine's image)."""
    return {path.name.split("-")[0] for path in env.glob("lib/python*/site-packages/*.dist-info")}


def ddp_results(cluster: ClusterInfo, workers: int, prefix: str = "DDP ") -> list[dict]:
    """The lines starting with `prefix` of every node, once each node's command has ended, as it succeeded."""
    lines = []
    for node in cluster.nodes:
        report = json.loads((wait_result(cluster, node.name, timeout=180) / "report.json").read_text())
        log = provisioner.fetch_logs(cluster, only=[node.name]).get(node.name, "")
        assert report["status"] == "succeeded", f"{node.name}: {report}\n{log[-3000:]}"
        lines += [json.loads(line.removeprefix(prefix)) for line in log.splitlines() if line.startswith(prefix)]
    return lines


def assert_trained_together(lines: list[dict], workers: int) -> None:
    """Every rank saw the whole world, the all-reduce summed every rank's share, and DDP kept the replicas equal
    though each trained on data of its own."""
    assert sorted(line["rank"] for line in lines) == list(range(workers))
    assert {line["world"] for line in lines} == {workers}
    assert {line["sum"] for line in lines} == {workers * (workers + 1) / 2}
    assert len({tuple(line["weights"]) for line in lines}) == 1


@pytest.mark.heavy
@pytest.mark.skipif(sandbox.unavailable() is not None, reason=f"no sandbox here: {sandbox.unavailable()}")
def test_a_two_worker_ddp_run_trains_in_the_local_sandbox_and_the_filter_still_refuses(tmp_path, settings):
    """gloo needed nothing of the filter: TCP between the nodes on the cluster's loopback, threads; a DataLoader's
    workers need fork, /dev/shm and AF_UNIX, which the sandbox gives any code. The calls it refuses stay refused."""
    settings.FC2_LOCAL_CLUSTER_DIR = tmp_path / "clusters"
    settings.FC2_TORCH_INDEX_URL = NO_INDEX
    cluster = local.launch(ClusterSpec("fc2-ddp-local", "local", "ddp", 2))
    try:
        cluster = provisioner.bootstrap(cluster, ddp_run(tmp_path, "demo.probe"))
        assert_trained_together(ddp_results(cluster, 2), 2)
        probes = ddp_results(cluster, 2, "PROBE ")
        refused = {"unshare(CLONE_NEWUSER)": "EPERM", "ptrace": "EPERM", "socket(AF_VSOCK)": "EPERM"}
        assert probes == [{"loaded": 32, "refused": refused}] * 2
        assert installed(Path(cluster.workdir) / "env") == {"demo"}  # torch is the machine image's
    finally:
        local.teardown(cluster.cluster_id)


@pytest.mark.heavy
@pytest.mark.skipif(bool(provisioner.unavailable("lab")), reason=str(provisioner.unavailable("lab")))
def test_a_two_worker_ddp_run_trains_across_lab_hosts_over_ssh(tmp_path, settings):
    """Each rank on a host of its own (its address, its sshd, its sandbox), 5 ms between them; torch from the host's
    image, nothing installed but the bundle; the node's CPU and traffic measured."""
    settings.FC2_TORCH_INDEX_URL = NO_INDEX
    spec = ClusterSpec("fc2-ddp-lab", "lab", "ddp", 2, worker_type="lab-w-250", latency_ms=5)
    cluster = provisioner.launch(spec)
    try:
        cluster = provisioner.bootstrap(cluster, ddp_run(tmp_path))
        assert_trained_together(ddp_results(cluster, 2), 2)
        assert [installed(Path(node.workdir) / "env") for node in cluster.nodes] == [{"demo"}] * 2
        # The agent measures a torch process as any other: its CPU, and the bytes DDP sent through the node's link.
        for node in cluster.nodes:
            samples = provisioner.kept_samples(cluster, node.name)
            assert max(s["cpu_percent"] for s in samples) > 0 and max(s["bytes_sent"] for s in samples) > 10_000
    finally:
        provisioner.teardown("lab", cluster.cluster_id)


@pytest.mark.parametrize(
    ("requires", "asked"),
    [
        (["torch==2.13.0"], "torch==2.13.0"),
        (["numpy", "Torch (>=2.1,<3)"], "torch<3,>=2.1"),
        (["torch[opt-einsum]>=2.0; python_version >= '3.8'"], "torch>=2.0"),
        (["torch==2.5; extra == 'old'", "torchvision==0.20"], "torch"),  # an extra's: not the bundle's own
        (["torch==2.1; sys_platform == 'win32'", "torch>=2.4; sys_platform == 'linux'"], "torch>=2.4"),  # a node's
        ([], "torch"),
    ],
)
def test_torch_is_installed_at_the_version_the_bundle_asks(tmp_path, requires, asked):
    metadata = "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    wheel = make_wheel(tmp_path, {**GOOD, f"{DIST_INFO}/METADATA": metadata.encode()})
    assert torch_requirement(wheel) == asked


def test_a_wheel_whose_requirement_pip_cannot_read_is_refused_before_the_install_saying_which(tmp_path):
    metadata = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nRequires-Dist: torch>=>2\n"
    wheel = make_wheel(tmp_path, {**GOOD, f"{DIST_INFO}/METADATA": metadata})
    with pytest.raises(ProvisionError, match="requires 'torch>=>2', which is not a valid requirement"):
        torch_requirement(wheel)


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ({"demo/main.py": b""}, "it has no .dist-info directory"),
        ({**GOOD, "demo-2.0.dist-info/METADATA": b""}, "more than one .dist-info directory"),
        ({k: v for k, v in GOOD.items() if k != f"{DIST_INFO}/METADATA"}, f"{DIST_INFO} has no METADATA"),
    ],
)
def test_a_wheel_without_one_whole_dist_info_is_refused_saying_why_as_the_upload_does(tmp_path, members, reason):
    wheel = make_wheel(tmp_path, members)
    with pytest.raises(ProvisionError, match=f"the bundle's wheel has no readable METADATA: not a wheel: .*{reason}"):
        torch_requirement(wheel)


def test_a_cpu_machine_takes_torch_alone_from_the_cpu_index_before_the_bundle_and_a_gpu_machine_from_pypi(
    tmp_path, settings
):
    settings.FC2_TORCH_INDEX_URL = "https://mirror.example/torch-cpu"
    wheel = ddp_wheel(tmp_path)
    cpu = install_steps(TORCH_RUN, 0, wheel, "/node/demo.whl")
    assert cpu == [
        ("torch's CPU build", ["--no-deps", "--index-url", "https://mirror.example/torch-cpu", "torch"]),
        ("the bundle", ["/node/demo.whl"]),
    ]
    assert install_steps(TORCH_RUN, 1, wheel, "/node/demo.whl") == [("the bundle", ["/node/demo.whl"])]
    assert install_steps(RunSpec(1, "w.whl", "demo.main"), 0, wheel, "/node/demo.whl") == [
        ("the bundle", ["/node/demo.whl"])
    ]


def test_an_aws_node_knows_its_gpus_from_its_instance_type_as_ec2_describes_it(aws_env):
    """g4dn.12xlarge has 4 GPUs (DescribeInstanceTypes' GpuInfo): 4 processes a node, on nccl; c4.xlarge none."""
    gpu = provisioner.launch(ClusterSpec("fc2-torch-gpu", "aws", "ddp", 2, worker_type="g4dn.12xlarge"))
    cpu = provisioner.launch(ClusterSpec("fc2-torch-cpu", "aws", "ddp", 1, worker_type="c4.xlarge"))
    assert [node.gpus for node in gpu.nodes] == [4, 4] and [node.gpus for node in cpu.nodes] == [0]
    argv = node_argv(gpu, gpu.nodes[0], TORCH_RUN, "python3", "/n")
    assert (
        argv[argv.index("--nproc-per-node") + 1] == "4" and argv[argv.index("--master-addr") + 1] == gpu.nodes[0].host
    )
    cpu_argv = node_argv(cpu, cpu.nodes[0], TORCH_RUN, "python3", "/n")
    assert cpu_argv == ["python3", "/n/fc2_launcher.py", "demo.main", "--epochs=2"]
    assert ClusterInfo.from_dict(gpu.to_dict()) == gpu  # recorded with the job, read back by any process


@pytest.mark.heavy
def test_a_two_worker_ddp_run_trains_on_aws_at_the_addresses_ec2_gave(ec2_hosts, tmp_path, settings):
    """The image has torch (a deep-learning AMI's, this machine's Python): the CPU index is asked for nothing."""
    settings.FC2_TORCH_INDEX_URL = NO_INDEX
    cluster = provisioner.launch(ClusterSpec("fc2-ddp-aws", "aws", "ddp", 2, worker_type="c4.xlarge"))
    try:
        cluster = provisioner.bootstrap(cluster, ddp_run(tmp_path))
        assert_trained_together(ddp_results(cluster, 2), 2)
        assert [installed(Path(node.workdir) / "env") for node in cluster.nodes] == [{"demo"}] * 2
    finally:
        provisioner.teardown("aws", cluster.cluster_id, cluster.region)


def fake_torch_index(index: Path, versions: list[str]) -> Path:
    """A package index (a directory pip reads as one) holding tiny stand-ins of torch's CPU wheels: each says its
    version, so a test sees which one a node got, and none pulls a dependency."""
    (index / "torch").mkdir(parents=True)
    for version in versions:
        dist_info = f"torch-{version}.dist-info"
        members = {
            "torch/__init__.py": f"__version__ = {version!r}\n".encode(),
            f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n".encode(),
            f"{dist_info}/WHEEL": GOOD[f"{DIST_INFO}/WHEEL"],
            f"{dist_info}/RECORD": b"",
        }
        make_wheel(index / "torch", members, f"torch-{version}-py3-none-any.whl")
    links = "".join(f'<a href="{wheel.name}">{wheel.name}</a>' for wheel in sorted((index / "torch").iterdir()))
    (index / "torch" / "index.html").write_text(f"<html><body>{links}</body></html>")  # the page pip reads
    return index


@pytest.mark.heavy
def test_an_aws_cpu_node_without_torch_takes_it_from_the_cpu_index_at_the_bundles_version(
    ec2_hosts, tmp_path, settings
):
    """An image with Python and pip only (a plain AMI's): torch comes from FC2_TORCH_INDEX_URL, at the version the
    bundle pins, before the bundle, whose install then finds it there."""
    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(image)], check=True, timeout=120)
    settings.FC2_AWS_PYTHON = str(image / "bin" / "python")
    settings.FC2_TORCH_INDEX_URL = fake_torch_index(tmp_path / "index", ["2.12.0+cpu", "2.13.0+cpu"]).as_uri()
    metadata = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nRequires-Dist: torch==2.12.0\n"
    code = b"import torch\nprint('TORCH ' + torch.__version__, flush=True)\n"
    wheel = make_wheel(tmp_path, {**GOOD, "demo/main.py": code, f"{DIST_INFO}/METADATA": metadata})
    data = tmp_path / "data.npz"
    np.savez(data, x=np.zeros(4))
    cluster = provisioner.launch(ClusterSpec("fc2-torch-aws-cpu", "aws", "ddp", 1, worker_type="c4.xlarge"))
    try:
        cluster = provisioner.bootstrap(
            cluster, RunSpec(1, str(wheel), "demo.main", dataset=str(data), framework="pytorch")
        )
        wait_result(cluster, "worker-0", timeout=120)
        assert "TORCH 2.12.0+cpu" in provisioner.fetch_logs(cluster)["worker-0"]
        assert installed(Path(cluster.nodes[0].workdir) / "env") == {"demo", "torch"}
        log = (Path(cluster.workdir) / "logs" / "worker-0.bootstrap.log").read_text()
        assert f"--no-deps --index-url {settings.FC2_TORCH_INDEX_URL} torch==2.12.0" in log
    finally:
        provisioner.teardown("aws", cluster.cluster_id, cluster.region)
