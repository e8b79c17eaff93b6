"""Dataclasses at the provider boundary: what a cluster should be, what was made, and what runs on it.

No ORM object crosses into provider code; these are plain values that serialise to JSON (the job keeps its
ClusterInfo so that any process — web, worker, CLI — can tear the cluster down).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class ClusterSpec:
    cluster_id: str  # unique name; every resource the provider makes is tagged/named with it
    provider: str  # "local", "aws" or "lab"
    strategy: str  # "ps" (1 PS + chief + workers) or "mirrored" (workers only, worker 0 is chief)
    workers: int  # number of training workers
    ps_type: str = ""  # instance type of the parameter server (ignored by the local provider)
    worker_type: str = ""  # instance type of the workers and the chief
    region: str = ""  # cloud region, when the provider has regions


@dataclass(frozen=True)
class NodeInfo:
    name: str  # "ps-0", "chief-0", "worker-1": role and TF task index
    role: str  # TensorFlow task type: "ps", "chief" or "worker"
    index: int  # TensorFlow task index within the role
    host: str  # address the other nodes reach this node at
    port: int  # TensorFlow gRPC port of this node
    instance_type: str = ""  # cloud instance type ("local" for a process on this machine)
    instance_id: str = ""  # provider's id for the machine, when it has one
    pid: int | None = None  # local provider: the agent process, once started
    pid_started: float | None = None  # its create_time, so a recycled pid is never mistaken for it
    workdir: str = ""  # the node's directory: its log, output and TF_CONFIG

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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ClusterInfo:
        nodes = tuple(NodeInfo(**node) for node in data["nodes"])
        return cls(**{**data, "nodes": nodes})

    def tf_cluster(self) -> dict[str, list[str]]:
        """The `cluster` part of TF_CONFIG: task addresses per role, ordered by task index."""
        roles: dict[str, list[str]] = {}
        for node in sorted(self.nodes, key=lambda n: (n.role, n.index)):
            roles.setdefault(node.role, []).append(node.address)
        return roles


@dataclass(frozen=True)
class RunSpec:
    job_id: int  # the platform's job id, for the agent's reports
    wheel_path: str  # the bundle's wheel on the platform's storage
    main_module: str  # run as `python -m main_module` on every node
    args: tuple[str, ...] = ()  # the job's parameters as `--key=value`
    dataset: str = ""  # dataset file path on the platform, or an http(s) URL the nodes fetch
    report_url: str = ""  # base URL of the platform as the nodes see it
    token: str = field(default="", repr=False)  # the job-scoped secret the agents report with


@dataclass(frozen=True)
class NodeResult:
    """What a node's agent kept on the node when its command ended, in case its final report never arrived."""

    report: dict  # the final report as the agent sends it: status, exit_code, progress, log_tail
    files: dict[str, bytes] = field(default_factory=dict, repr=False)  # the output files it would upload


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
    if strategy == "mirrored":
        return [("worker", i) for i in range(workers)]
    raise ValueError(f"unknown strategy {strategy!r} (expected 'ps' or 'mirrored')")


def is_chief(strategy: str, role: str, index: int) -> bool:
    """The node whose completion ends the job: the PS strategy's chief, or mirrored worker 0."""
    return role == "chief" or (strategy == "mirrored" and role == "worker" and index == 0)
