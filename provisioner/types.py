"""Dataclasses at the provider boundary: what a cluster should be, what was made, and what runs on it.

No ORM object crosses into provider code; these are plain values that serialise to JSON (the job keeps its
ClusterInfo so that any process — web, worker, CLI — can tear the cluster down).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


@dataclass(frozen=True)
class ClusterSpec:
    cluster_id: str  # unique name; every resource the provider makes is tagged/named with it
    provider: str  # "local", "aws" or "lab"
    strategy: str  # "ps" (1 PS + chief + workers), or "mirrored" / "ddp" (workers only, worker 0 is chief)
    workers: int  # number of training workers
    ps_type: str = ""  # instance type of the parameter server (ignored by the local provider)
    worker_type: str = ""  # instance type of the workers and the chief
    region: str = ""  # cloud region, when the provider has regions
    latency_ms: float = 0.0  # lab: every packet from one node to another arrives this late (a round trip takes 2x)
    job_id: int = 0  # the platform's job the cluster is for (0: none, e.g. `cluster up`); cloud resources carry it
    spot: bool = False  # aws: spot instances (InstanceMarketOptions) rather than on-demand
    spot_max_price: float | None = None  # aws: the most $/h a spot instance may cost (None: up to the on-demand price)


@dataclass(frozen=True)
class NodeInfo:
    name: str  # "ps-0", "chief-0", "worker-1": role and TF task index
    role: str  # TensorFlow task type: "ps", "chief" or "worker"
    index: int  # TensorFlow task index within the role
    host: str  # internal address: the other nodes reach this node at it (the nodes' TF_CONFIG)
    port: int  # TensorFlow gRPC port of this node
    instance_type: str = ""  # cloud instance type ("local" for a process on this machine)
    instance_id: str = ""  # provider's id for the machine, when it has one
    external_host: str = ""  # the address the platform reaches the node at (SSH); "" = the node is this machine
    ssh_port: int = 22  # the node's SSH server, when it has one (external_host set)
    ssh_user: str = ""  # the user the platform logs in as over SSH
    pid: int | None = None  # the node's agent process on its machine, once started
    pid_started: float | None = None  # local provider: its create_time, so a recycled pid is never mistaken for it
    workdir: str = ""  # the node's directory on its machine: its log, result, job's work and output
    gpus: int = 0  # GPUs of its machine (its instance type's): a PyTorch node runs one process per GPU, on nccl
    cpus: int = 0  # its CPU share where it shares a machine with other nodes (a lab host's quota); 0: the whole machine

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ClusterInfo:
    cluster_id: str  # as in the spec
    provider: str  # as in the spec
    strategy: str  # as in the spec
    nodes: tuple[NodeInfo, ...]  # every node, PS first, then chief, then workers
    workdir: str = ""  # provider-side directory of the cluster (local: the whole cluster lives there)
    region: str = ""  # as in the spec
    sandbox_uid: int | None = None  # the unprivileged uid the job's code runs as (provisioner/sandbox.py), if any
    latency_ms: float = 0.0  # as in the spec

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ClusterInfo:
        """A ClusterInfo as recorded (by to_dict), also by an older version: fields it no longer has are dropped."""
        node_fields = {f.name for f in fields(NodeInfo)}
        nodes = tuple(NodeInfo(**{k: v for k, v in node.items() if k in node_fields}) for node in data["nodes"])
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in known}, "nodes": nodes})

    def save(self, directory: Path) -> None:
        """Record the cluster in `directory`/cluster.json, whole or not at all (written aside, then renamed)."""
        partial = directory / "cluster.json.partial"
        partial.write_text(json.dumps(self.to_dict()))
        partial.replace(directory / "cluster.json")

    @classmethod
    def load(cls, directory: Path) -> ClusterInfo | None:
        """The cluster recorded in `directory` by `save`, or None when there is none."""
        try:
            return cls.from_dict(json.loads((directory / "cluster.json").read_text()))
        except (OSError, ValueError):
            return None

    def tf_cluster(self) -> dict[str, list[str]]:
        """The `cluster` part of TF_CONFIG: task addresses per role, ordered by task index."""
        roles: dict[str, list[str]] = {}
        for node in sorted(self.nodes, key=lambda n: (n.role, n.index)):
            roles.setdefault(node.role, []).append(node.address)
        return roles


@dataclass(frozen=True)
class RunSpec:
    """What to run on a cluster. Paths are on the platform's storage: the bootstrap copies them to the nodes."""

    job_id: int  # the platform's job id, for the agent's reports
    wheel_path: str  # the bundle's wheel on the platform's storage (copied to every node)
    main_module: str  # run as `python -m main_module` on every node
    args: tuple[str, ...] = ()  # the job's parameters as `--key=value`
    dataset: str = ""  # dataset file on the platform's storage (copied to the nodes), or an http(s) URL they fetch
    report_url: str = ""  # base URL of the platform as the platform itself is reached (the provider may say otherwise)
    token: str = field(default="", repr=False)  # the job-scoped secret the agents report with
    timeout_s: int = 6 * 3600  # the agents stop their command this long after the start, whatever happens
    max_artifact_mb: int = 200  # the largest output file an agent uploads
    max_dataset_mb: int = 500  # the largest dataset an agent downloads
    fetch_allow: tuple[str, ...] = ()  # private networks an agent may fetch a dataset from (monitor/safe_fetch.py)
    # Set on Scala-Opt's profiling run only: the code trains at least this many seconds whatever its epochs
    # (FC2_TRAIN_SECONDS, examples/README.md), so that one worker's bandwidth can be measured; 0: as its parameters say.
    train_seconds: int = 0
    # Managed jobs (issue 45). A checkpoint archive on the platform's storage to restore from: copied to every node and
    # unpacked there, its directory given as FC2_RESTORE_FROM ("" = start from scratch). Every node also gets
    # FC2_CHECKPOINT_DIR, where its code writes its checkpoints (the chief's are shipped to the platform).
    restore_from: str = ""
    # The agent stops its own machine when the platform has been silent to it this long (FC2_NODE_ORPHAN_S; 0 = never)
    orphan_s: int = 0
    # What the code trains with (issue 46): "tensorflow" (TF_CONFIG) or "pytorch" (torchrun's variables, DDP).
    framework: str = "tensorflow"


@dataclass(frozen=True)
class NodeResult:
    """What a node's agent kept on the node when its command ended, in case its final report never arrived."""

    report: dict  # the final report as the agent sends it: status, exit_code, progress, log_tail
    files: dict[str, bytes] = field(default_factory=dict, repr=False)  # the output files it would upload, by number

    @property
    def outputs(self) -> dict[str, bytes]:
        """The output files by the names the node's code gave them, escaped as the report names them (a folder's
        archive as `<name>.zip`)."""
        names = {
            output.get("file"): output.get("path", "") + (".zip" if output.get("archive") else "")
            for output in self.report.get("outputs") or []
            if isinstance(output, dict)
        }
        return {names.get(wire) or wire: data for wire, data in self.files.items()}


def cluster_directory(root: Path, cluster_id: str) -> Path:
    """A provider's directory for cluster `cluster_id` under its `root`; a name that would lead elsewhere is refused."""
    from provisioner.errors import ProvisionError

    if not cluster_id or "/" in cluster_id or cluster_id.startswith("."):
        raise ProvisionError(f"invalid cluster id {cluster_id!r}")
    return root / cluster_id


# The strategies with no parameter server: every node a worker, worker 0 the chief. "mirrored" is TensorFlow's
# MultiWorkerMirroredStrategy, "ddp" PyTorch's DistributedDataParallel (rank 0 = worker 0).
ALL_REDUCE = ("mirrored", "ddp")


def node_layout(strategy: str, workers: int) -> list[tuple[str, int]]:
    """(role, index) of every node of a cluster.

    >>> node_layout("ps", 2)
    [('ps', 0), ('chief', 0), ('worker', 0), ('worker', 1)]
    >>> node_layout("mirrored", 2)
    [('worker', 0), ('worker', 1)]
    """
    if workers < 1:
        raise ValueError("a cluster needs at least one worker")
    if strategy == "ps":
        return [("ps", 0), ("chief", 0)] + [("worker", i) for i in range(workers)]
    if strategy in ALL_REDUCE:
        return [("worker", i) for i in range(workers)]
    raise ValueError(f"unknown strategy {strategy!r} (expected 'ps', 'mirrored' or 'ddp')")


def is_chief(strategy: str, role: str, index: int) -> bool:
    """The node whose completion ends the job: the PS strategy's chief, or an all-reduce cluster's worker 0."""
    return role == "chief" or (strategy in ALL_REDUCE and role == "worker" and index == 0)
