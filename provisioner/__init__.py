"""Cluster provisioning: one interface of plain functions, routed by provider name to `provisioner.<name>`.

Every provider module has the same functions:

- `launch(spec: ClusterSpec) -> ClusterInfo` — make the machines (idempotent for the same cluster_id).
- `start(cluster: ClusterInfo, run: RunSpec) -> ClusterInfo` — bootstrap every node (wheel, agent, dataset,
  TF_CONFIG per role) and start the node agents; returns the cluster with what it started.
- `alive(cluster: ClusterInfo) -> dict[str, bool]` — node name -> whether its agent is still running.
- `fetch_logs(cluster: ClusterInfo) -> dict[str, str]` — node name -> its full log, before teardown.
- `fetch_results(cluster: ClusterInfo) -> dict[str, NodeResult]` — node name -> the final report (and output files)
  its agent kept on the node, for nodes whose command has ended; the way to a result whose report never arrived.
- `teardown(cluster: ClusterInfo) -> None` — stop and delete everything; safe to call twice or on a half-made cluster.
"""

from __future__ import annotations

import importlib

from provisioner.types import ClusterInfo, ClusterSpec, NodeInfo, NodeResult, RunSpec

PROVIDERS = {
    "local": "provisioner.local",
}

__all__ = [
    "PROVIDERS",
    "ClusterInfo",
    "ClusterSpec",
    "NodeInfo",
    "NodeResult",
    "RunSpec",
    "alive",
    "fetch_logs",
    "fetch_results",
    "launch",
    "start",
    "teardown",
]


class ProvisionError(RuntimeError):
    """A cluster could not be made or started; the message says why."""


def _provider(name: str):
    try:
        return importlib.import_module(PROVIDERS[name])
    except KeyError:
        raise ProvisionError(f"unknown provider {name!r} (available: {', '.join(sorted(PROVIDERS))})") from None


def launch(spec: ClusterSpec) -> ClusterInfo:
    return _provider(spec.provider).launch(spec)


def start(cluster: ClusterInfo, run: RunSpec) -> ClusterInfo:
    return _provider(cluster.provider).start(cluster, run)


def alive(cluster: ClusterInfo) -> dict[str, bool]:
    return _provider(cluster.provider).alive(cluster)


def fetch_logs(cluster: ClusterInfo) -> dict[str, str]:
    return _provider(cluster.provider).fetch_logs(cluster)


def fetch_results(cluster: ClusterInfo) -> dict[str, NodeResult]:
    return _provider(cluster.provider).fetch_results(cluster)


def teardown(cluster: ClusterInfo) -> None:
    _provider(cluster.provider).teardown(cluster)
