"""Cluster provisioning: one interface of plain functions over dataclasses, routed by provider name.

The interface is declared once, in provisioner/interface.py (`Primitives`: `unavailable`, `regions`, `launch`,
`teardown`, `list_clusters`, `get_cluster`, `machine`, `node_command`, `report_url`, with the defaults where the
providers agree); the registry and the one router are provisioner/registry.py (`PROVIDERS`: name → label, limits,
module; `primitives(name)`). The providers, with the same function names: `provisioner.local` (processes here),
`provisioner.lab` (network namespaces with their own sshd: provisioner/lab/), `provisioner.aws` (EC2 through the one
boto3 adaptor, common/awsapi.py: provisioner/aws/).

The functions below are what the rest of the platform calls. Bootstrap, liveness, logs and kept results are the
same for every provider (provisioner/nodes.py). Errors are `ProvisionError`s; transient ones
(`TransientProvisionError`) are worth retrying (provisioner/errors.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from provisioner import nodes as _nodes
from provisioner.errors import CapacityError, NodeError, ProvisionError, TransientProvisionError
from provisioner.registry import PROVIDERS, Provider, get, primitives
from provisioner.runners import run_parallel
from provisioner.types import ClusterInfo, ClusterSpec, NodeInfo, NodeResult, RunSpec

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
    "answering",
    "bootstrap",
    "fetch_logs",
    "fetch_results",
    "get",
    "get_cluster",
    "kept_samples",
    "launch",
    "list_clusters",
    "primitives",
    "regions",
    "relaunch",
    "run_on",
    "stop_agents",
    "teardown",
    "unavailable",
    "wait_ready",
]


def unavailable(name: str) -> str | None:
    """Why provider `name` cannot make a cluster on this installation, and the way to change that; None when it can."""
    if name not in PROVIDERS:
        return f"the {name} provider is not available on this installation (registered: {', '.join(sorted(PROVIDERS))})"
    return primitives(name).unavailable()


def launch(spec: ClusterSpec, notify: Callable[[str], None] | None = None) -> ClusterInfo:
    """Make (or find) the cluster; `notify(message)` is told what is worth a line on the job's timeline on the way
    (a zone out of capacity, another tried)."""
    return primitives(spec.provider).launch(spec, notify or _ignore)


def relaunch(
    spec: ClusterSpec, old: ClusterInfo | None, lost: Sequence[str], notify: Callable[[str], None] | None = None
) -> ClusterInfo:
    """The cluster made again after the nodes named in `lost` were lost (a managed job's resume), none of its nodes
    running anything: the survivors' agents are stopped and what they kept removed, so that every node starts afresh
    (a survivor that no longer answers is replaced too).

    A provider that can replace single machines (`replace_nodes(cluster_id, region, nodes)`: aws) has the
    lost nodes' machines removed, and its launch, idempotent by the cluster's tag, makes only the shortfall. Any other
    finds its cluster by its record, which cannot tell a lost host from a live one: it is torn down and launched
    whole (on the lab, seconds). With no node made yet (a launch that failed before any) it is launched again. With
    none named in `lost` (a restart made again after its bootstrap was lost: its lost nodes' machines were replaced
    by its first relaunch) every node's machine is looked at, and those that answer are kept, not replaced again."""
    module = primitives(spec.provider)
    replace_nodes = getattr(module, "replace_nodes", None)
    if old is not None and old.nodes:
        if replace_nodes is None:
            module.teardown(spec.cluster_id, spec.region)
        else:
            up = answering(replace(old, nodes=tuple(n for n in old.nodes if n.name not in lost)))
            _settle(replace(old, nodes=tuple(n for n in old.nodes if up.get(n.name))))
            # A survivor that no longer answers either is replaced with the lost
            replace_nodes(spec.cluster_id, spec.region, [n for n in old.nodes if not up.get(n.name)])
    return module.launch(spec, notify or _ignore)


def _settle(cluster: ClusterInfo) -> None:
    """Stop the nodes' agents and remove the results they kept (a stopped agent keeps one), so that nothing of the
    run before is taken for the next one's."""
    _nodes.stop_agents(cluster)
    for node in cluster.nodes:
        if node.workdir:
            _nodes.run_on(cluster, node.name, ["rm", "-rf", f"{node.workdir}/result"])


def answering(cluster: ClusterInfo, timeout_s: float = 5.0) -> dict[str, bool]:
    """Node name -> whether its machine answers (its SSH server, within `timeout_s`): a node that does not is lost."""
    module = primitives(cluster.provider)

    def one(node: NodeInfo) -> bool:
        try:
            machine = module.machine(cluster, node)
            try:
                machine.runner.wait_ready(timeout_s)
            finally:
                machine.runner.close()
        except (ProvisionError, OSError):
            return False
        return True

    return run_parallel({node.name: partial(one, node) for node in cluster.nodes})


def _ignore(message: str) -> None:
    """Nobody to tell."""


def bootstrap(cluster: ClusterInfo, run: RunSpec) -> ClusterInfo:
    return _nodes.bootstrap(cluster, run)


def teardown(provider: str, cluster_id: str, region: str = "") -> list[str]:
    """Remove the cluster and everything it had; returns what was removed (empty when nothing was left)."""
    return primitives(provider).teardown(cluster_id, region)


def regions(provider: str) -> list[str]:
    """The regions the provider makes clusters in on this installation (the reaper looks in each); [""] when it has
    none."""
    return primitives(provider).regions()


def list_clusters(provider: str, region: str = "") -> list[str]:
    return primitives(provider).list_clusters(region)


def get_cluster(provider: str, cluster_id: str, region: str = "") -> ClusterInfo | None:
    """The cluster as its provider knows it (its nodes and their addresses), or None when there is none by that name."""
    return primitives(provider).get_cluster(cluster_id, region)


wait_ready = _nodes.wait_ready
run_on = _nodes.run_on
alive = _nodes.alive
fetch_logs = _nodes.fetch_logs
fetch_results = _nodes.fetch_results
kept_samples = _nodes.kept_samples
stop_agents = _nodes.stop_agents
