"""The provider interface, declared once: the primitives every provider module (`provisioner.local`,
`provisioner.lab`, `provisioner.aws`) has under the same names, and the defaults for those where providers agree.

`Primitives` is what the router (provisioner/registry.py, `primitives(name)`) hands out: the provider module itself
(SkyPilot's `sky/provision/__init__.py` is the model), which mypy checks against this protocol (PEP 544: a module
implements a protocol), so a provider lacking a primitive, or with one of another signature, fails `make test`. A
provider that agrees with a default below imports it under the primitive's name. A new provider is a module (a
sub-package where it has more than one file) with these functions, and an entry in the registry. Inputs and outputs
are the dataclasses of provisioner/types.py and the two below; no ORM object crosses in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from provisioner.runners import Runner
from provisioner.types import ClusterInfo, ClusterSpec, NodeInfo

# The node agent, the module it downloads datasets with and the launcher a PyTorch node's module runs through, under
# the names they have on a node (the bootstrap copies them into the node's directory; a provider may look for the
# agent's process by its name; a sandbox shows the launcher to the command, read-only, where it is).
AGENT_FILES = {"agent.py": "fc2_agent.py", "safe_fetch.py": "safe_fetch.py", "launcher.py": "fc2_launcher.py"}


@dataclass(frozen=True)
class Machine:
    """A node's machine as the bootstrap sees it."""

    runner: Runner  # runs commands and copies files there
    host: str  # which machine it is (nodes with the same host and install_dir share one install)
    root: str  # the node's directory on the machine
    python: str  # the machine's Python: makes the job's env (with the machine's packages) and runs the agent
    install_dir: str  # where the job's env is made; nodes of one machine share it
    platform_storage: bool = False  # the machine is the platform's: a dataset file is used where it is, not copied


@dataclass(frozen=True)
class NodeCommand:
    """How the node's command runs on its machine."""

    argv: tuple[str, ...]  # the command as the agent starts it (inside the node's sandbox, where it has one)
    data: str  # the dataset file's path as the command sees it (FC2_DATA)
    output: str  # the output directory as the command sees it (FC2_OUTPUT_DIR)
    work: str  # its working directory and HOME, as the command sees it
    agent_output: str  # the output directory as the agent sees it (its files become artifacts)
    agent_cwd: str  # the working directory the agent starts the command in
    agent_args: tuple[str, ...] = field(default=())  # more agent options (e.g. --memory-cgroup)


class Primitives(Protocol):
    """What a provider does; every call finds what it needs from the cluster's name (and region), so that none needs
    anything a crash could have lost. Errors are `ProvisionError`s, transient ones (`TransientProvisionError`) worth
    retrying (provisioner/errors.py)."""

    def unavailable(self) -> str | None:
        """Why the provider cannot make clusters on this installation, and how to enable it; None when it can."""
        ...

    def regions(self) -> list[str]:
        """The regions it makes clusters in on this installation (the reaper looks in each). Default: [""], a
        provider without regions."""
        ...

    def launch(self, spec: ClusterSpec, notify: Callable[[str], None]) -> ClusterInfo:
        """Make the machines, telling `notify` what the job's timeline should show (a zone out of capacity, another
        tried). Idempotent by the cluster's name or tag: a second launch finds what the first made and makes only
        what is missing. One that fails part-way removes what it made."""
        ...

    def teardown(self, cluster_id: str, region: str) -> list[str]:
        """Find everything of the cluster by its name or tag and remove it; safe twice and on a half-made cluster.
        Returns what it removed (empty when nothing was left)."""
        ...

    def list_clusters(self, region: str) -> list[str]:
        """The names of this installation's clusters that have anything left, however far their launch got."""
        ...

    def get_cluster(self, cluster_id: str, region: str) -> ClusterInfo | None:
        """The cluster as launched (its nodes and their addresses), found by its name; None when there is none."""
        ...

    def machine(self, cluster: ClusterInfo, node: NodeInfo) -> Machine:
        """The node's machine: how to run commands there (subprocess or SSH), where the node lives, its Python."""
        ...

    def node_command(self, cluster: ClusterInfo, node: NodeInfo, argv: list[str], dataset: str) -> NodeCommand:
        """How the node's command runs on its machine (in the sandbox, where the provider has one)."""
        ...

    def report_url(self, cluster: ClusterInfo, url: str) -> str:
        """The platform's URL `url` as the cluster's nodes reach it. Default: `url` itself."""
        ...


# ---- defaults, where providers agree (a provider module imports one under the primitive's name) -------------------


def regions() -> list[str]:
    return [""]


def report_url(cluster: ClusterInfo, url: str) -> str:
    return url
