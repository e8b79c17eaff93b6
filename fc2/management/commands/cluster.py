"""`manage.py cluster up|down|list|ssh|reap`: clusters by hand, through the same provider layer as jobs.

    cluster up --provider local|lab --worker-type T [--ps-type T] --workers N [--strategy ps|mirrored]
               [--latency-ms L] --name NAME [--no-bootstrap] [--json]
    cluster down NAME [--provider P] [--json]
    cluster list [--provider P] [--json]
    cluster ssh NAME NODE [--provider P] -- COMMAND…
    cluster reap --provider P [--all] [--json]

`up` twice with the same name leaves one cluster (launch is idempotent by name); without --no-bootstrap it waits until
every node answers (its SSH server, on lab and aws). `reap` removes the clusters of jobs that no job records any more
(left by a crash), and with --all every cluster of the provider that no job records, those made by `up` too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import provisioner
from fc2.models import ReapedCluster
from fc2.services import jobs, sweep
from provisioner import ClusterSpec, ProvisionError
from recommender.management.base import ContractCommand


class Command(ContractCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True, help="what to do (each has its own --help)")
        providers = sorted(provisioner.PROVIDERS)

        up = actions.add_parser("up", help="make a cluster (or find the one of that name)")
        up.add_argument("--provider", required=True, choices=providers)
        up.add_argument("--region", default="")
        up.add_argument("--worker-type", required=True)
        up.add_argument("--ps-type", default="")
        up.add_argument("--workers", type=int, required=True)
        up.add_argument("--strategy", choices=["ps", "mirrored"], default="ps")
        up.add_argument("--latency-ms", type=float, default=0.0, help="lab: delay of every node-to-node packet")
        up.add_argument("--name", required=True)
        up.add_argument("--no-bootstrap", action="store_true", help="do not wait for the nodes to answer")

        down = actions.add_parser("down", help="remove a cluster")
        down.add_argument("name")
        down.add_argument("--provider", choices=providers)
        down.add_argument("--region", default="")

        listing = actions.add_parser("list", help="the clusters that exist")
        listing.add_argument("--provider", choices=providers)
        listing.add_argument("--region", default="")

        run = actions.add_parser("ssh", help="run a command on a node, over the cluster's own SSH")
        run.add_argument("name")
        run.add_argument("node")
        run.add_argument("--provider", choices=providers)
        run.add_argument("--region", default="")
        run.add_argument("command", nargs=argparse.REMAINDER)

        reap = actions.add_parser("reap", help="remove leftover clusters no job records")
        reap.add_argument("--provider", required=True, choices=providers)
        reap.add_argument("--region", default="")
        reap.add_argument("--all", action="store_true", help="also clusters made by `cluster up`")

        for sub in (up, down, listing, run, reap):
            sub.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, action: str, **options):
        try:
            out = getattr(self, f"_{action}")(**options)
        except (ProvisionError, ValueError) as exc:
            self.fail(str(exc), options.get("json", False))
        if action == "ssh":
            return
        if options.get("json"):
            self.stdout.write(json.dumps(out))
        else:
            self.stdout.write("\n".join(TEXT[action](out)))

    def _up(self, *, provider, region, worker_type, ps_type, workers, strategy, latency_ms, name, no_bootstrap, **_):
        if reason := provisioner.unavailable(provider):
            raise ProvisionError(reason)
        jobs.check_workers(provider, workers)
        if latency_ms and not provisioner.get(provider).latency:
            raise ProvisionError(f"the {provider} provider cannot add latency between its nodes")
        spec = ClusterSpec(
            cluster_id=name,
            provider=provider,
            strategy=strategy,
            workers=workers,
            ps_type=ps_type,
            worker_type=worker_type,
            region=region,
            latency_ms=latency_ms,
        )
        cluster = provisioner.launch(spec)
        if not no_bootstrap:
            provisioner.wait_ready(cluster)
        return _describe(cluster)

    def _find(self, name: str, provider: str | None, region: str) -> str:
        candidates = [provider] if provider else sorted(provisioner.PROVIDERS)
        for candidate in candidates:
            if provisioner.unavailable(candidate) is None and name in provisioner.list_clusters(candidate, region):
                return candidate
        raise ProvisionError(f"no cluster named {name!r}" + (f" on {provider}" if provider else ""))

    def _down(self, *, name, provider, region, **_):
        provider = self._find(name, provider, region)
        resources = provisioner.teardown(provider, name, region)
        return {"name": name, "provider": provider, "removed": True, "resources": resources}

    def _list(self, *, provider, region, **_):
        providers = [provider] if provider else sorted(provisioner.PROVIDERS)
        clusters = []
        for name in providers:
            if provisioner.unavailable(name) is None:
                for cluster_id in provisioner.list_clusters(name, region):
                    cluster = provisioner.get_cluster(name, cluster_id, region)
                    clusters.append(_describe(cluster) if cluster else {"name": cluster_id, "provider": name})
        return {"clusters": clusters}

    def _ssh(self, *, name, node, provider, region, command, **options):
        command = command[1:] if command[:1] == ["--"] else command
        if not command:
            raise ValueError("no command given after --")
        provider = self._find(name, provider, region)
        cluster = provisioner.get_cluster(provider, name, region)
        if cluster is None or node not in {n.name for n in cluster.nodes}:
            known = ", ".join(n.name for n in cluster.nodes) if cluster else "none"
            raise ProvisionError(f"cluster {name} has no node {node!r} (nodes: {known})")
        result = provisioner.run_on(cluster, node, command)
        if options.get("json"):
            self.stdout.write(json.dumps({"name": name, "node": node, **dataclasses.asdict(result)}))
        else:
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
        sys.stdout.flush()
        if result.exit_status:
            sys.exit(result.exit_status if 0 < result.exit_status < 256 else 1)

    def _reap(self, *, provider, region, all: bool, **_):
        if reason := provisioner.unavailable(provider):
            raise ProvisionError(reason)
        reaped = sweep.reap(provider, region, every=all, by=ReapedCluster.By.COMMAND)
        return {
            "provider": provider,
            "removed": [reaping.cluster_name for reaping in reaped],
            "resources": {reaping.cluster_name: reaping.resources for reaping in reaped},
        }


def _cluster_lines(cluster: dict) -> list[str]:
    """A cluster as people read it: a line of its own, then a line per node.

    >>> print("\\n".join(_cluster_lines({"name": "c1", "provider": "lab", "strategy": "ps", "latency_ms": 5.0,
    ...     "nodes": [{"name": "ps-0", "role": "ps", "instance_type": "lab.small", "address": "10.213.1.2",
    ...                "ssh": "fc2@10.213.1.2:22", "instance_id": ""}]})))
    cluster c1 on lab (ps, 5 ms between the nodes): 1 node
      ps-0  ps  lab.small  10.213.1.2  ssh fc2@10.213.1.2:22
    """
    nodes = cluster.get("nodes")
    if nodes is None:  # listed, but its state could not be read
        return [f"cluster {cluster['name']} on {cluster['provider']} (its nodes could not be read)"]
    delay = f", {cluster['latency_ms']:g} ms between the nodes" if cluster.get("latency_ms") else ""
    lines = [
        f"cluster {cluster['name']} on {cluster['provider']} ({cluster['strategy']}{delay}): {_count(nodes, 'node')}"
    ]
    for node in nodes:
        where = [node["address"], f"ssh {node['ssh']}" if node["ssh"] else "", node["instance_id"]]
        lines.append(
            "  " + "  ".join(part for part in (node["name"], node["role"], node["instance_type"], *where) if part)
        )
    return lines


def _count(items, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _removed_lines(out: dict) -> list[str]:
    """
    >>> _removed_lines({"name": "c1", "provider": "lab", "removed": True, "resources": ["namespace fc2-a", "veth x"]})
    ['removed cluster c1 on lab: 2 resources', '  namespace fc2-a', '  veth x']
    """
    resources = out["resources"]
    return [f"removed cluster {out['name']} on {out['provider']}: {_count(resources, 'resource')}"] + [
        f"  {resource}" for resource in resources
    ]


def _reaped_lines(out: dict) -> list[str]:
    """
    >>> _reaped_lines({"provider": "lab", "removed": [], "resources": {}})
    ['no leftover cluster on lab']
    >>> _reaped_lines({"provider": "lab", "removed": ["c1"], "resources": {"c1": ["namespace fc2-a"]}})
    ['removed 1 leftover cluster on lab:', '  c1: namespace fc2-a']
    """
    if not out["removed"]:
        return [f"no leftover cluster on {out['provider']}"]
    lines = [f"removed {_count(out['removed'], 'leftover cluster')} on {out['provider']}:"]
    return lines + [
        f"  {name}: {', '.join(out['resources'].get(name, [])) or 'nothing left'}" for name in out["removed"]
    ]


# `cluster ACTION` without --json: what it did, in lines (with --json: the one object, as the contract says).
TEXT = {
    "up": _cluster_lines,
    "down": _removed_lines,
    "list": lambda out: [line for c in out["clusters"] for line in _cluster_lines(c)] or ["no clusters"],
    "reap": _reaped_lines,
}


def _describe(cluster) -> dict:
    return {
        "name": cluster.cluster_id,
        "provider": cluster.provider,
        "strategy": cluster.strategy,
        "latency_ms": cluster.latency_ms,
        "nodes": [
            {
                "name": node.name,
                "role": node.role,
                "instance_type": node.instance_type,
                "address": node.host,
                "ssh": f"{node.ssh_user}@{node.external_host}:{node.ssh_port}" if node.external_host else "",
                "instance_id": node.instance_id,
            }
            for node in cluster.nodes
        ],
    }
