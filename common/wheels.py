"""What a wheel's METADATA requires, read once for the platform and the nodes: its Requires-Dist as pip reads it on
a Linux node (`requires_dist`).

Used by the upload's checks (fc2/bundles.py: the bundle's framework and CUDA need) and the bootstrap
(provisioner/nodes.py: the torch version a CPU node takes from the CPU index), which may not import each other.
"""

from __future__ import annotations

from packaging.markers import default_environment
from packaging.metadata import parse_email
from packaging.requirements import InvalidRequirement, Requirement


def requires_dist(metadata: bytes) -> list[Requirement]:
    """The requirements a wheel's METADATA installs on a Linux node (its Requires-Dist, as pip reads them): those only
    an extra asks for, or whose marker leaves out a Linux node's Python, are not installed and are left out. Raises
    ValueError, saying why, for METADATA that is not UTF-8 or a Requires-Dist that is no valid requirement (pip
    would refuse to install the wheel).

    >>> metadata = b"Name: d\\nRequires-Dist: torch>=2\\nRequires-Dist: numpy; extra == 'x'\\n"
    >>> [str(r) for r in requires_dist(metadata)]
    ['torch>=2']
    >>> [str(r) for r in requires_dist(b"Name: d\\nRequires-Dist: a; sys_platform == 'win32'\\nRequires-Dist: b\\n")]
    ['b']
    >>> requires_dist(b"Name: d\\nRequires-Dist: torch>=>2\\n")
    Traceback (most recent call last):
    ...
    ValueError: the wheel's METADATA requires 'torch>=>2', which is not a valid requirement
    """
    raw, _ = parse_email(metadata.decode("utf-8"))
    # pip evaluates markers on the node: Linux, no extra asked for (the Python version taken as the platform's own).
    environment = {key: str(value) for key, value in default_environment().items()}
    environment |= {"sys_platform": "linux", "platform_system": "Linux", "extra": ""}
    requires = []
    for line in raw.get("requires_dist", []):
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            raise ValueError(f"the wheel's METADATA requires {line!r}, which is not a valid requirement") from None
        if requirement.marker is None or requirement.marker.evaluate(environment):
            requires.append(requirement)
    return requires
