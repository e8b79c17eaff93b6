"""What the platform does on every cluster's nodes, whatever the provider: the bootstrap, liveness, logs, results.

A provider says what each node's machine is (`machine(cluster, node)`: a command runner — subprocess on this machine
for `local`, SSH for `lab` and `aws` — the node's directory there, the machine's Python) and how the node's command
runs on it (`node_command`: in the sandbox on `local` and `lab`). Everything else is the same on every provider and
lives here. On all nodes at once, each step retried with backoff while it fails transiently, each node's commands in
its own bootstrap log:

1. the node's directory; the node agent (monitor/agent.py and the module it fetches datasets with) and the launcher
   a PyTorch node's module runs through (monitor/launcher.py, `node_argv`);
2. the job's wheel, installed into a virtualenv layered on the machine's own packages (TensorFlow is part of the
   machine's image), from wheels only (`--only-binary=:all:`: no build script of the user's runs as root). Nodes that
   share a machine (`local`) share one install; a marker outside the env says it finished;
3. the dataset: copied from the platform's storage (or used where it is, when the machine is the platform's), or
   left for the agent to fetch from its URL;
4. the report token (0600, read only by the agent) and the command's environment (TF_CONFIG for the node's role with
   the nodes' own addresses — or, for a PyTorch run, torchrun's variables with worker 0 as the rendezvous, and on a
   node with GPUs the command run through torch.distributed.run, one process per GPU: `torch_environment` — FC2_*;
   FC2_TRAIN_SECONDS on a profiling run only; FC2_CHECKPOINT_DIR, and FC2_RESTORE_FROM when the run resumes from a
   checkpoint archive, RunSpec.restore_from, copied to the node);
5. the agent, started detached from the runner's session; it starts the node's command beside it and reports. It
   unpacks the archive to restore from before the command starts; on the chief it ships the command's checkpoints;
   with RunSpec.orphan_s it stops its own machine, its provider's way (Provider.self_stop), once the platform has been
   silent to it that long; on aws it polls the instance metadata for a spot interruption notice.

The node's directory (its `root`) holds: `fc2_agent.py`, `safe_fetch.py`, `fc2_launcher.py`, `token`, `env.json`,
`node.log` (the command's output), `agent.log`, `result/` (the final report the agent keeps until delivered), `data/`
and, for a run that reports to nobody (RunSpec.report_url empty: Scala-Opt's profiling run), `samples.jsonl`
(`kept_samples`), `restore.tar.gz` (the checkpoint to resume from) and `spot-instance-action` (an interruption notice
raised through the agent: `cluster ssh NAME NODE -- sh -c 'echo {...} > spot-instance-action'`). The command's working
directory holds `checkpoints/` (FC2_CHECKPOINT_DIR) and `restore/` (FC2_RESTORE_FROM).
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path, PurePosixPath
from typing import TypeVar

from django.conf import settings
from packaging.utils import canonicalize_name

from common.retry import retry
from common.wheels import find_dist_info, requires_dist
from provisioner.errors import NodeError, ProvisionError, transient
from provisioner.interface import AGENT_FILES, Machine, NodeCommand, Primitives
from provisioner.registry import get, primitives
from provisioner.runners import Result, run_parallel
from provisioner.types import ALL_REDUCE, ClusterInfo, NodeInfo, NodeResult, RunSpec, is_chief

logger = logging.getLogger(__name__)

T = TypeVar("T")

MONITOR_DIR = Path(__file__).resolve().parent.parent / "monitor"
# Environment passed through to the node's command; nothing else of the platform's (database URLs, secrets).
PASSTHROUGH_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
INSTALL_TIMEOUT_S = 900
READY_TIMEOUT_S = 120  # how long a node's machine may take to answer (its SSH server to come up)
PARALLEL_NODES = 16  # nodes bootstrapped at once (benchmarks/lab_bootstrap.py sets 1 to compare)
MAX_REPORT_BYTES = 16 * 2**20  # a final report kept on the node: the outputs it names included
SAMPLES_FILE = "samples.jsonl"  # where the agent of a run that reports to nobody keeps its samples
CHECKPOINTS, RESTORED = (
    "checkpoints",
    "restore",
)  # in the command's working directory: FC2_CHECKPOINT_DIR, FC2_RESTORE_FROM
RESTORE_ARCHIVE = "restore.tar.gz"  # in the node's directory: the checkpoint archive the run resumes from
# RunSpec.framework's values: how the nodes are told their cluster (TF_CONFIG, or torchrun's variables).
PYTORCH = "pytorch"
FRAMEWORKS = ("tensorflow", PYTORCH)
# An output's name as its agent keeps and sends it (monitor/agent.py, Outputs).
WIRE_NAME = re.compile(r"[0-9]{1,6}")


def bootstrap(cluster: ClusterInfo, run: RunSpec) -> ClusterInfo:
    """Install and start every node of the cluster in parallel; returns the cluster with each node's agent pid.

    A node already started (a redelivered step) is left running as it is."""
    check_framework(cluster, run)
    provider = primitives(cluster.provider)
    machines = {node.name: provider.machine(cluster, node) for node in cluster.nodes}
    try:
        ready = {name: partial(m.runner.wait_ready, READY_TIMEOUT_S) for name, m in machines.items()}
        run_parallel(ready, max_workers=PARALLEL_NODES)
        installs: dict[str, list[NodeInfo]] = {}
        for node in cluster.nodes:
            machine = machines[node.name]
            installs.setdefault(f"{machine.host}:{machine.install_dir}", []).append(node)
        # One install per machine, by its first node; the other nodes of that machine wait for it.
        firsts = {nodes[0].name: (machines[nodes[0].name], nodes[0].gpus) for nodes in installs.values()}
        python = run_parallel(
            {name: partial(_step, m, "install the bundle", _install, m, run, g) for name, (m, g) in firsts.items()},
            max_workers=PARALLEL_NODES,
        )
        env_python = {node.name: python[nodes[0].name] for nodes in installs.values() for node in nodes}
        started = run_parallel(
            {
                node.name: partial(
                    _start_node, provider, cluster, node, machines[node.name], run, env_python[node.name]
                )
                for node in cluster.nodes
            },
            max_workers=PARALLEL_NODES,
        )
    finally:
        for machine in machines.values():
            machine.runner.close()
    return replace(cluster, nodes=tuple(started[node.name] for node in cluster.nodes))


def wait_ready(cluster: ClusterInfo, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait until every node's machine answers (its SSH server), all at once; raises naming a node that does not."""
    provider = primitives(cluster.provider)

    def one(node: NodeInfo) -> None:
        machine = provider.machine(cluster, node)
        try:
            machine.runner.wait_ready(timeout_s)
        finally:
            machine.runner.close()

    run_parallel({node.name: partial(one, node) for node in cluster.nodes})


def run_on(cluster: ClusterInfo, node_name: str, command: Sequence[str]) -> Result:
    """Run `command` on one node's machine (over its SSH on lab and aws) and return what it did."""
    node = next(n for n in cluster.nodes if n.name == node_name)
    machine = primitives(cluster.provider).machine(cluster, node)
    try:
        machine.runner.wait_ready(READY_TIMEOUT_S)
        return machine.runner.run(command, check=False)
    finally:
        machine.runner.close()


def _step(machine: Machine, what: str, action: Callable[..., T], *args: object) -> T:
    try:
        return retry(lambda: action(*args), retryable=transient, what=f"{machine.runner.node}: {what}")
    except NodeError:
        raise
    except ProvisionError as error:
        raise NodeError(machine.runner.node, f"{what}: {error}", transient=error.transient) from error


def _install(machine: Machine, run: RunSpec, gpus: int) -> str:
    """The job's env on the machine with the wheel installed (once), after torch's CPU build for a PyTorch run on a
    machine without `gpus`; returns its interpreter."""
    runner, base = machine.runner, PurePosixPath(machine.install_dir)
    env, marker = (
        base / "env",
        base / "env.installed",
    )  # the marker outside the env: nothing the wheel installs makes it
    env_python = str(env / "bin" / "python")
    if runner.run(["test", "-e", str(marker)], check=False).exit_status == 0:
        return env_python
    wheel = base / Path(run.wheel_path).name
    runner.run(["mkdir", "-p", str(base)])
    runner.put(Path(run.wheel_path), str(wheel))
    # A venv that also sees the machine's packages: a .pth file naming the machine Python's site-packages, as real
    # paths (a virtualenv reached through a symlink is mounted in the sandbox where it really is). Made afresh: an env
    # whose install did not finish may hold half of the wheel, whose code would then run as root.
    layered = (
        "import site, sys, sysconfig, pathlib; "
        "pathlib.Path(sysconfig.get_path('purelib', vars={'base': sys.argv[1], 'platbase': sys.argv[1]}))"
        ".joinpath('fc2-platform.pth')"
        ".write_text(''.join(str(pathlib.Path(p).resolve()) + chr(10) for p in site.getsitepackages()))"
    )
    runner.run(["rm", "-rf", str(env)])
    runner.run([machine.python, "-m", "venv", "--without-pip", str(env)])
    runner.run([machine.python, "-c", layered, str(env)])
    # Only wheels: pip runs no code to install one, whereas building a source distribution (a dependency's) would
    # run its setup.py on the machine, as root.
    pip = [machine.python, "-m", "pip", "--python", env_python, "install", "--no-input", "--only-binary=:all:"]
    pip += ["--disable-pip-version-check", "--no-warn-script-location", "--quiet"]
    for what, arguments in install_steps(run, gpus, Path(run.wheel_path), str(wheel)):
        result = runner.run([*pip, *arguments], timeout_s=INSTALL_TIMEOUT_S, check=False)
        if result.exit_status != 0:
            tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-5:])
            raise NodeError(runner.node, f"installing {what} failed: {tail}")
    runner.run(["touch", str(marker)])
    return env_python


def install_steps(run: RunSpec, gpus: int, wheel: Path, remote_wheel: str) -> list[tuple[str, list[str]]]:
    """(what, pip's arguments) of each install into the job's env. A PyTorch run on a machine without a GPU installs
    torch first, alone (--no-deps: nothing else from that index), from FC2_TORCH_INDEX_URL, at the version the bundle
    asks (`torch_requirement`): the bundle's install then finds torch there and never pulls PyPI's CUDA build, which
    a GPU machine gets. pip takes nothing where the machine's image has a torch that satisfies it (local, lab)."""
    steps = [("the bundle", [remote_wheel])]
    if run.framework == PYTORCH and not gpus:
        torch = ["--no-deps", "--index-url", settings.FC2_TORCH_INDEX_URL, torch_requirement(wheel)]
        steps.insert(0, ("torch's CPU build", torch))
    return steps


def torch_requirement(wheel: Path) -> str:
    """The bundle's requirement on torch (its wheel's Requires-Dist as pip reads it on the node, without extras), e.g.
    `torch==2.13.0`; `torch` when it names none (its code imports torch all the same)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            metadata = archive.read(f"{find_dist_info(archive.namelist())}/METADATA")
    except (OSError, zipfile.BadZipFile, ValueError) as error:
        raise ProvisionError(f"the bundle's wheel has no readable METADATA: {error}") from error
    try:
        requires = requires_dist(metadata)
    except ValueError as error:  # (the upload's checks refuse such a wheel, as they refuse one find_dist_info does)
        raise ProvisionError(f"the bundle's wheel: {error}") from error
    for requirement in requires:
        if canonicalize_name(requirement.name) == "torch":
            return f"torch{requirement.specifier}"
    return "torch"


def _dataset(machine: Machine, run: RunSpec) -> tuple[str, str]:
    """(the dataset's path on the node's machine, the URL its agent fetches it from or "")."""
    root = PurePosixPath(machine.root)
    if run.dataset.startswith(("http://", "https://")):
        name = PurePosixPath(run.dataset.split("?")[0].split("#")[0]).name or "dataset"
        return str(root / "data" / name), run.dataset
    source = Path(run.dataset)
    if not source.is_file():
        raise ProvisionError(f"dataset file {run.dataset} does not exist")
    if machine.platform_storage:
        return str(source), ""
    target = str(root / "data" / source.name)
    machine.runner.put(source, target)
    return target, ""


def node_environment(
    cluster: ClusterInfo, node: NodeInfo, command: NodeCommand, run: RunSpec, interface: str = ""
) -> dict[str, str]:
    """The node's command's whole environment: the platform's FC2_* and its framework's (`interface`: the network
    interface holding the node's own address, where the node found one; see `torch_environment`)."""
    # Only a profiling run asks the code to train for a time (RunSpec.train_seconds); a job trains as its epochs say.
    train = {"FC2_TRAIN_SECONDS": str(run.train_seconds)} if run.train_seconds else {}
    restore = {"FC2_RESTORE_FROM": f"{command.work}/{RESTORED}"} if run.restore_from else {}
    if run.framework == PYTORCH:
        framework = torch_environment(cluster, node, interface)
    else:
        tf_config = {"cluster": cluster.tf_cluster(), "task": {"type": node.role, "index": node.index}}
        framework = {"TF_CONFIG": json.dumps(tf_config), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return {
        **PASSTHROUGH_ENV,
        "HOME": command.work,
        **framework,
        "FC2_STRATEGY": cluster.strategy,
        "FC2_ROLE": node.role,
        "FC2_TASK_INDEX": str(node.index),
        "FC2_IS_CHIEF": "1" if is_chief(cluster.strategy, node.role, node.index) else "0",
        "FC2_DATA": command.data,
        "FC2_OUTPUT_DIR": command.output,
        "FC2_CLUSTER_ID": cluster.cluster_id,
        "FC2_CHECKPOINT_DIR": f"{command.work}/{CHECKPOINTS}",
        **restore,
        "PYTHONUNBUFFERED": "1",
        **train,
    }


def torch_environment(cluster: ClusterInfo, node: NodeInfo, interface: str = "") -> dict[str, str]:
    """What `torchrun` would give a PyTorch node's code, so that code written for it runs unchanged with
    `init_process_group(init_method="env://")`: worker 0 is rank 0 and its address and port (the TensorFlow port, free
    since no TensorFlow server runs) the rendezvous. A CPU node runs one process, given torchrun's variables here, and
    trains on gloo; a GPU node runs one process per GPU through torch.distributed.run (`node_argv`), which gives each
    its own ranks, on nccl. None of TORCHELASTIC_*: they tell code an elastic agent is there (its store to join,
    `is_torchelastic_launched`), which only a GPU node's has. FC2_DIST_BACKEND says which backend the node's hardware
    wants; GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME on a GPU node) is the interface of the node's own address: left to
    itself gloo binds the address its host name resolves to, the loopback where it resolves to nothing (a sandbox's
    host name, a lab host's), which the other nodes cannot reach."""
    master = _ranks(cluster)[0]
    found = {"GLOO_SOCKET_IFNAME": interface} if interface else {}
    env = {"MASTER_ADDR": master.host, "MASTER_PORT": str(master.port), **found}
    if node.gpus:
        return env | {"FC2_DIST_BACKEND": "nccl"} | ({"NCCL_SOCKET_IFNAME": interface} if interface else {})
    rank, world = str(node.index), str(len(_ranks(cluster)))
    torchrun = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    # torch starts a thread per core it sees; a node sharing its machine under a CPU quota (a lab host) would then
    # run more threads than its share and wait on them: as many as its share, as torchrun does (one each)
    # for processes that share a machine. Code may still set its own (torch.set_num_threads).
    torchrun |= {"OMP_NUM_THREADS": str(node.cpus)} if node.cpus else {}
    torchrun |= {"GROUP_RANK": rank, "GROUP_WORLD_SIZE": world, "ROLE_RANK": rank, "ROLE_WORLD_SIZE": world}
    return env | torchrun | {"ROLE_NAME": "default", "FC2_DIST_BACKEND": "gloo"}


def node_argv(cluster: ClusterInfo, node: NodeInfo, run: RunSpec, python: str, root: str) -> list[str]:
    """The node's command: the bundle's main module (`python -m`); on a PyTorch node, through the launcher in the
    node's directory `root` (monitor/launcher.py: the module ends as under `python -m`, without the interpreter's
    finalization, where torch's gloo aborts now and then), one process per GPU through torch.distributed.run on a
    node with GPUs (each given its RANK, LOCAL_RANK and WORLD_SIZE by it)."""
    module = [run.main_module, *run.args]
    if run.framework != PYTORCH:
        return [python, "-m", *module]
    launched = [str(PurePosixPath(root) / AGENT_FILES["launcher.py"]), *module]
    if not node.gpus:
        return [python, *launched]
    master = _ranks(cluster)[0]
    launcher = ["--nnodes", str(len(_ranks(cluster))), "--nproc-per-node", str(node.gpus)]
    launcher += ["--node-rank", str(node.index), "--master-addr", master.host, "--master-port", str(master.port)]
    return [python, "-m", "torch.distributed.run", *launcher, *launched]


def _ranks(cluster: ClusterInfo) -> list[NodeInfo]:
    """A PyTorch cluster's nodes in rank order: its workers by index (an all-reduce layout: worker 0 is the chief)."""
    return sorted((node for node in cluster.nodes if node.role == "worker"), key=lambda node: node.index)


def check_framework(cluster: ClusterInfo, run: RunSpec) -> None:
    """Refuse, before anything is installed, a framework the nodes cannot be told their cluster for, and a PyTorch job
    on a cluster with a parameter server (DDP is all-reduce: every node a rank, nothing for a PS to run)."""
    if run.framework not in FRAMEWORKS:
        raise ProvisionError(f"unknown framework {run.framework!r} (expected {' or '.join(map(repr, FRAMEWORKS))})")
    if run.framework == PYTORCH and cluster.strategy not in ALL_REDUCE:
        raise ProvisionError(
            f"a PyTorch job trains with DistributedDataParallel (all-reduce), not on a {cluster.strategy!r} cluster: "
            "its strategy must be ddp"
        )


def _start_node(
    provider: Primitives, cluster: ClusterInfo, node: NodeInfo, machine: Machine, run: RunSpec, python: str
) -> NodeInfo:
    if node.pid and _agent_running(machine, node.pid):
        return node  # started before (a redelivered step)
    runner, root = machine.runner, PurePosixPath(machine.root)

    def prepare() -> tuple[str, str]:
        runner.run(["mkdir", "-p", str(root / "data")])
        for source, name in AGENT_FILES.items():
            runner.put(MONITOR_DIR / source, str(root / name))
        return _dataset(machine, run)

    def copy_checkpoint() -> str:
        if machine.platform_storage:
            return run.restore_from
        runner.put(Path(run.restore_from), str(root / RESTORE_ARCHIVE))
        return str(root / RESTORE_ARCHIVE)

    dataset, fetch = _step(machine, "copy the agent and the dataset", prepare)
    restore = _step(machine, "copy the checkpoint to restore", copy_checkpoint) if run.restore_from else ""
    command = provider.node_command(cluster, node, node_argv(cluster, node, run, python, str(root)), dataset)
    entry = get(cluster.provider)

    def start() -> int:
        # The command's output and working directories: a sandbox made them already, a cloud node has none.
        runner.run(["mkdir", "-p", command.agent_output, command.agent_cwd])
        runner.put_bytes(run.token.encode(), str(root / "token"), 0o600)
        interface = _interface(machine, node.host) if run.framework == PYTORCH else ""
        environment = json.dumps(node_environment(cluster, node, command, run, interface)).encode()
        runner.put_bytes(environment, str(root / "env.json"), 0o600)
        agent = [machine.python, str(root / AGENT_FILES["agent.py"])]
        # No report URL: a run that reports to nobody, whose agents keep their samples on the node (samples.jsonl).
        url = provider.report_url(cluster, run.report_url) if run.report_url else ""
        agent += ["--url", url, "--job", str(run.job_id), "--node", node.name]
        agent += [] if url else ["--keep-samples", str(root / SAMPLES_FILE)]
        agent += ["--token-file", str(root / "token"), "--env-file", str(root / "env.json")]
        agent += ["--deadline", str(int(time.time() + run.timeout_s))]
        agent += ["--log", str(root / "node.log"), "--output", command.agent_output]
        agent += ["--result", str(root / "result"), "--cwd", command.agent_cwd]
        agent += ["--max-artifact-mb", str(run.max_artifact_mb), *command.agent_args]
        agent += [
            flag for flag, own in (("--own-network", entry.own_network), ("--own-machine", entry.own_machine)) if own
        ]
        if fetch:
            agent += ["--fetch", fetch, "--fetch-to", dataset, "--fetch-max-mb", str(run.max_dataset_mb)]
            agent += [arg for net in run.fetch_allow for arg in ("--fetch-allow", net)]
        agent += _checkpoint_args(cluster, node, command, url, restore)
        if run.orphan_s and url:
            agent += ["--orphan-s", str(run.orphan_s), "--self-stop", entry.self_stop, "--netns", node.instance_id]
        if entry.spot_notices and (metadata := settings.FC2_AWS_METADATA_URL):
            agent += ["--spot-metadata", metadata]
        return runner.start_detached(
            ["sh", "-c", f'cd {shlex.quote(str(root))} && exec "$@"', "sh", *agent, "--", *command.argv],
            str(root / "agent.log"),
        )

    pid = _step(machine, "start the node agent", start)
    return replace(node, pid=pid, workdir=str(root))


def _interface(machine: Machine, address: str) -> str:
    """The network interface that holds `address` on the node's machine, as `ip` names it; "" when none does."""
    found = machine.runner.run(["ip", "-o", "address", "show", "to", address], check=False)
    fields = found.stdout.split()
    return fields[1] if found.exit_status == 0 and len(fields) > 1 else ""


def _checkpoint_args(cluster: ClusterInfo, node: NodeInfo, command: NodeCommand, url: str, restore: str) -> list[str]:
    """The agent's options for the command's checkpoints: where they are, whether it ships them (the chief, to a
    platform that listens), the size bound, and the archive to restore from."""
    args = ["--checkpoints", f"{command.agent_cwd}/{CHECKPOINTS}"]
    args += ["--checkpoint-max-mb", str(settings.FC2_CHECKPOINT_MAX_MB)]
    if url and is_chief(cluster.strategy, node.role, node.index):
        args.append("--ship-checkpoints")
    if restore:
        args += ["--restore", restore, "--restore-to", f"{command.agent_cwd}/{RESTORED}"]
    return args


def _agent_running(machine: Machine, pid: int) -> bool:
    """Whether the node's agent (pid, running our agent file from the node's directory) is still running."""
    agent = str(PurePosixPath(machine.root) / AGENT_FILES["agent.py"])
    proc = f"/proc/{int(pid)}"
    check = f"grep -qaF {shlex.quote(agent)} {proc}/cmdline && ! grep -q '^State:.*Z' {proc}/status"
    return machine.runner.run(check, check=False).exit_status == 0


# Prints the pids of the processes whose program is the agent file given (argv[1] of `python agent.py …`, as the
# bootstrap starts it): never this script itself, which has it as a later argument.
_FIND_AGENTS = """
import os, sys
agent = os.fsencode(sys.argv[1])
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read().split(b"\\0")
    except OSError:
        continue
    if len(argv) > 1 and argv[1] == agent:
        print(pid)
"""


def _agents(machine: Machine) -> list[int]:
    """The pids of the agents running the node's agent file on its machine."""
    agent = str(PurePosixPath(machine.root) / AGENT_FILES["agent.py"])
    found = machine.runner.run([machine.python, "-c", _FIND_AGENTS, agent], check=False)
    return [int(pid) for pid in found.stdout.split() if pid.isdigit()]


def alive(cluster: ClusterInfo) -> dict[str, bool | None]:
    """Node name -> whether its agent is still running; None for a node whose machine cannot be reached (its host
    gone, its link cut, its SSH server dead): the others are answered all the same."""
    provider = primitives(cluster.provider)

    def one(node: NodeInfo) -> bool | None:
        if not node.pid:
            return False
        try:
            machine = provider.machine(cluster, node)
            try:
                return _agent_running(machine, node.pid)
            finally:
                machine.runner.close()
        except (ProvisionError, OSError) as error:
            logger.warning("%s cannot be reached: %s", node.name, error)
            return None

    return run_parallel({node.name: partial(one, node) for node in cluster.nodes})


def _read_nodes(
    cluster: ClusterInfo, read: Callable[[Machine, PurePosixPath], T | None], only: Sequence[str] | None = None
) -> dict[str, T]:
    """Node name -> what `read` found on it, for the nodes (all, or those named in `only`) where it found something;
    a node that cannot be reached is left out."""
    provider = primitives(cluster.provider)

    def one(node: NodeInfo) -> T | None:
        try:
            machine = provider.machine(cluster, node)
            try:
                return read(machine, PurePosixPath(machine.root))
            finally:
                machine.runner.close()
        except (ProvisionError, OSError) as error:  # one node out of reach never costs what the others have
            logger.warning("%s cannot be read: %s", node.name, error)
            return None

    nodes = [node for node in cluster.nodes if only is None or node.name in only]
    found = run_parallel({node.name: partial(one, node) for node in nodes})
    return {name: value for name, value in found.items() if value is not None}


def fetch_logs(cluster: ClusterInfo, max_bytes: int = 64 * 2**20, only: Sequence[str] | None = None) -> dict[str, str]:
    """Node name -> its command's log (node.log), for the nodes (all, or those named in `only`) that have one."""

    def read(machine: Machine, root: PurePosixPath) -> str | None:
        log = str(root / "node.log")
        if machine.runner.run(["test", "-f", log], check=False).exit_status != 0:
            return None
        return machine.runner.get(log, max_bytes=max_bytes).decode(errors="replace")

    return _read_nodes(cluster, read, only)


def fetch_results(cluster: ClusterInfo, max_file_bytes: int = 2**31) -> dict[str, NodeResult]:
    """Node name -> the final report (and output files) its agent kept on the node, for nodes whose command ended.

    The report names its files (`outputs`, each by its wire name: a number), so nothing on the node is listed or
    parsed: a file the report names that cannot be read is left out (the report still says it was there)."""

    def read(machine: Machine, root: PurePosixPath) -> NodeResult | None:
        runner, kept = machine.runner, root / "result"
        try:
            report = json.loads(runner.get(str(kept / "report.json"), max_bytes=MAX_REPORT_BYTES))
        except (ProvisionError, OSError, ValueError, RecursionError):
            return None  # no final report kept: the command has not ended, or the agent died before it could keep one
        if not isinstance(report, dict):
            return None
        files = {}
        for output in report.get("outputs") or []:
            wire = output.get("file") if isinstance(output, dict) else None
            if not isinstance(wire, str) or not WIRE_NAME.fullmatch(wire):
                continue
            try:
                files[wire] = runner.get(str(kept / "files" / wire), max_bytes=max_file_bytes)
            except (ProvisionError, OSError) as error:
                logger.warning("%s: kept output %s cannot be read: %s", runner.node, wire, error)
        return NodeResult(report=report, files=files)

    return _read_nodes(cluster, read)


def kept_samples(cluster: ClusterInfo, node_name: str, max_bytes: int = 16 * 2**20) -> list[dict]:
    """The resource samples the node's agent kept on the node (a run that reports to nobody), oldest first."""
    node = next(n for n in cluster.nodes if n.name == node_name)
    machine = primitives(cluster.provider).machine(cluster, node)
    path = str(PurePosixPath(machine.root) / SAMPLES_FILE)
    try:
        if machine.runner.run(["test", "-f", path], check=False).exit_status != 0:
            return []
        text = machine.runner.get(path, max_bytes=max_bytes).decode(errors="replace")
    finally:
        machine.runner.close()
    samples = []
    for line in text.splitlines():
        try:
            sample = json.loads(line)
        except ValueError:
            continue  # the line being written as it was read
        if isinstance(sample, dict):
            samples.append(sample)
    return samples


def stop_agents(cluster: ClusterInfo, grace_s: float = 5.0) -> None:
    """Ask every node's agent to stop its command (SIGTERM), and wait up to `grace_s` for them to go: the agent its
    record names, else every agent of the node's directory (`_agents`: one a bootstrap started whose worker was lost
    before it recorded the pid)."""
    provider = primitives(cluster.provider)

    def one(node: NodeInfo) -> None:
        machine = provider.machine(cluster, node)
        try:
            for pid in [node.pid] if node.pid else _agents(machine):
                if _agent_running(machine, pid):
                    machine.runner.run(
                        f"kill -TERM {int(pid)}; for i in $(seq {int(grace_s * 10)}); do "
                        f"kill -0 {int(pid)} 2>/dev/null || exit 0; sleep 0.1; done",
                        check=False,
                    )
        finally:
            machine.runner.close()

    run_parallel({node.name: partial(one, node) for node in cluster.nodes})
