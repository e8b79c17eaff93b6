"""Cluster provisioning: a registry of providers and one interface of plain functions, routed by provider name.

Each provider is a module (`provisioner.local`, `provisioner.lab`, …) with the same primitives:

- `unavailable() -> str | None` — why the provider cannot make clusters on this installation (and how to enable it);
- `launch(spec, notify) -> ClusterInfo` — make the machines, telling `notify` what the job's timeline should show;
  idempotent by the cluster's name (a second launch finds what the first made and makes only what is missing); one
  that fails part-way removes what it made;
- `teardown(cluster_id, region) -> list[str]` — find everything of the cluster by its name and remove it; safe
  twice, safe on a half-made cluster, needs nothing a crash could have lost; says what it removed;
- `list_clusters(region) -> list[str]` — the names of the clusters that exist;
- `get_cluster(cluster_id, region) -> ClusterInfo | None` — a cluster as launched, found by its name;
- `machine(cluster, node)` and `node_command(cluster, node, argv, dataset)` and `report_url(cluster, url)` — what the
  shared bootstrap (provisioner/nodes.py) needs to know of a node's machine: how to run commands there (subprocess
  or SSH), where the node lives, how its command runs, and how the nodes reach the platform.

Bootstrap, liveness, logs and kept results are the same for every provider (provisioner/nodes.py). Errors are
`ProvisionError`s; transient ones (`TransientProvisionError`) are worth retrying (provisioner/errors.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from provisioner import nodes as _nodes
from provisioner.errors import CapacityError, NodeError, ProvisionError, TransientProvisionError
from provisioner.types import ClusterInfo, ClusterSpec, NodeInfo, NodeResult, RunSpec


@dataclass(frozen=True)
class Provider:
    name: str  # as jobs, the CLI and the API name it
    label: str  # as the wizard shows it
    module: str  # dotted path of the module with the provider's primitives
    max_workers: int  # the most workers one of its clusters may have
    regions: bool = False  # whether a cluster is made in a region the user chooses
    catalog: str = ""  # the instance catalogue its types come from, when only one can be (recommender/catalogs/)
    latency: bool = False  # whether it can delay the packets between a cluster's nodes (ClusterSpec.latency_ms)
    description: str = ""  # one line on what its clusters are
    # Seconds a teardown takes, until this installation has measured its own (the budget watchdog stops a job this
    # much earlier: a cluster costs until its teardown has ended).
    teardown_s: float = 0.0
    needs_worker_type: bool = False  # whether a cluster must be given its instance types (no default machine)
    # What of a node is its own, for the agent to measure as the node's: its network (a namespace or machine of its
    # own: its interfaces' counters are its traffic) and its machine (the whole CPU is its).
    own_network: bool = False
    own_machine: bool = False
    # Whether its nodes are the instance types they are given (their CPU and links are the type's): what a job
    # measures on them is a performance record of those types.
    typed_nodes: bool = False


PROVIDERS: dict[str, Provider] = {
    "local": Provider(
        "local",
        "Local (this machine)",
        "provisioner.local",
        max_workers=8,  # each node is a TensorFlow process of ~600 MB, all on this machine
        teardown_s=1.0,
        description="processes on the platform's machine, each node sandboxed",
    ),
    "lab": Provider(
        "lab",
        "Lab (emulated cloud on this machine)",
        "provisioner.lab",
        max_workers=8,  # a TensorFlow process of ~600 MB per node, all on this machine
        catalog="lab",
        latency=True,
        own_network=True,
        typed_nodes=True,
        teardown_s=3.0,
        description="network namespaces with their own addresses, SSH servers and shaped links",
    ),
    "aws": Provider(
        "aws",
        "AWS EC2",
        "provisioner.aws",
        max_workers=64,
        regions=True,
        needs_worker_type=True,
        own_network=True,
        own_machine=True,
        typed_nodes=True,
        teardown_s=90.0,  # terminate, wait for terminated (about a minute on EC2), then the network and the key
        description="EC2 instances in a VPC of their own, bootstrapped over SSH",
    ),
}

__all__ = [
    "PROVIDERS",
    "CapacityError",
    "ClusterInfo",
    "ClusterSpec",
    "NodeError",
    "NodeInfo",
    "NodeResult",
    "ProvisionError",
    "Provider",
    "RunSpec",
    "TransientProvisionError",
    "alive",
    "bootstrap",
    "fetch_logs",
    "fetch_results",
    "get",
    "get_cluster",
    "kept_samples",
    "launch",
    "list_clusters",
    "regions",
    "run_on",
    "stop_agents",
    "teardown",
    "unavailable",
    "wait_ready",
]


def get(name: str) -> Provider:
    try:
        return PROVIDERS[name]
    except KeyError:
        raise ProvisionError(f"unknown provider {name!r} (available: {', '.join(sorted(PROVIDERS))})") from None


def _module(name: str):
    return importlib.import_module(get(name).module)


def unavailable(name: str) -> str | None:
    """Why provider `name` cannot make a cluster on this installation, and the way to change that; None when it can."""
    if name not in PROVIDERS:
        return f"the {name} provider is not available on this installation (registered: {', '.join(sorted(PROVIDERS))})"
    return _module(name).unavailable()


def launch(spec: ClusterSpec, notify: Callable[[str], None] | None = None) -> ClusterInfo:
    """Make (or find) the cluster; `notify(message)` is told what is worth a line on the job's timeline on the way
    (a zone out of capacity, another tried)."""
    return _module(spec.provider).launch(spec, notify=notify or _ignore)


def _ignore(message: str) -> None:
    """Nobody to tell."""


def bootstrap(cluster: ClusterInfo, run: RunSpec) -> ClusterInfo:
    return _nodes.bootstrap(cluster, run)


def teardown(provider: str, cluster_id: str, region: str = "") -> list[str]:
    """Remove the cluster and everything it had; returns what was removed (empty when nothing was left)."""
    return _module(provider).teardown(cluster_id, region)


def regions(provider: str) -> list[str]:
    """The regions the provider makes clusters in on this installation (the reaper looks in each); [""] when it has
    none."""
    return _module(provider).regions() if get(provider).regions else [""]


def list_clusters(provider: str, region: str = "") -> list[str]:
    return _module(provider).list_clusters(region)


def get_cluster(provider: str, cluster_id: str, region: str = "") -> ClusterInfo | None:
    """The cluster as its provider knows it (its nodes and their addresses), or None when there is none by that name."""
    return _module(provider).get_cluster(cluster_id, region)


wait_ready = _nodes.wait_ready
run_on = _nodes.run_on
alive = _nodes.alive
fetch_logs = _nodes.fetch_logs
fetch_results = _nodes.fetch_results
kept_samples = _nodes.kept_samples
stop_agents = _nodes.stop_agents
