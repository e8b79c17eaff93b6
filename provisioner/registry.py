"""The provider registry (name → label, limits, module) and the one router: `primitives(name)`, the provider's
module, which implements provisioner/interface.py's `Primitives` (mypy checks each module against it).
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.errors import ProvisionError
from provisioner.interface import Primitives


@dataclass(frozen=True)
class Provider:
    """A provider as the registry describes it: what the wizard, the API and the budget watchdog know of it; its
    primitives are its module's (`modules()`; provisioner/interface.py says which)."""

    name: str  # as jobs, the CLI and the API name it
    label: str  # as the wizard shows it
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
    # How a node's agent stops its own machine when the platform has been silent to it for RunSpec.orphan_s
    # (monitor/agent.py, self_stop): `processes` ends the node's command, `netns` removes the lab host, `shutdown`
    # halts the instance (launched to terminate on shutdown).
    self_stop: str = "processes"
    # Whether its nodes poll the instance metadata for a spot interruption notice (FC2_AWS_METADATA_URL).
    spot_notices: bool = False


PROVIDERS: dict[str, Provider] = {
    "local": Provider(
        "local",
        "Local (this machine)",
        max_workers=8,  # each node is a TensorFlow process of ~600 MB, all on this machine
        teardown_s=1.0,
        description="processes on the platform's machine, each node sandboxed",
    ),
    "lab": Provider(
        "lab",
        "Lab (emulated cloud on this machine)",
        max_workers=8,  # a TensorFlow process of ~600 MB per node, all on this machine
        catalog="lab",
        latency=True,
        own_network=True,
        typed_nodes=True,
        teardown_s=3.0,
        self_stop="netns",
        description="network namespaces with their own addresses, SSH servers and shaped links",
    ),
    "aws": Provider(
        "aws",
        "AWS EC2",
        max_workers=64,
        regions=True,
        needs_worker_type=True,
        own_network=True,
        own_machine=True,
        typed_nodes=True,
        teardown_s=90.0,  # terminate, wait for terminated (about a minute on EC2), then the network and the key
        self_stop="shutdown",
        spot_notices=True,
        description="EC2 instances in a VPC of their own, bootstrapped over SSH",
    ),
}


def get(name: str) -> Provider:
    try:
        return PROVIDERS[name]
    except KeyError:
        raise ProvisionError(f"unknown provider {name!r} (available: {', '.join(sorted(PROVIDERS))})") from None


def modules() -> dict[str, Primitives]:
    """Each registered provider's module, as the `Primitives` it implements: mypy checks every module here against
    the protocol. Imported when a provider is first routed to (the pages and the API read PROVIDERS without them);
    a primitive is looked up on the module at each call, so a test's patch of the module is seen."""
    from provisioner import aws, lab, local

    return {"local": local, "lab": lab, "aws": aws}


def primitives(name: str) -> Primitives:
    """The router: provider `name`'s primitives (ProvisionError for a provider not registered)."""
    return modules()[get(name).name]
