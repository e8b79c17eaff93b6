"""A wheel's metadata, read once for the platform and the nodes: where it lies (its one `.dist-info` directory,
`find_dist_info`) and what it requires (its Requires-Dist as pip reads it on a Linux node, `requires_dist`).

Used by the upload's checks (fc2/bundles.py: the bundle's framework and CUDA need) and the bootstrap
(provisioner/nodes.py: the torch version a CPU node takes from the CPU index), which may not import each other.
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.markers import default_environment
from packaging.metadata import parse_email
from packaging.requirements import InvalidRequirement, Requirement

REQUIRED_DIST_INFO_FILES = ("WHEEL", "METADATA", "RECORD")


def find_dist_info(names: Sequence[str]) -> str:
    """The wheel's one top-level `.dist-info` directory among its member names, checked to hold WHEEL, METADATA and
    RECORD. Raises ValueError, saying why, for a zip that is no such wheel; each caller words it as its own error.

    >>> find_dist_info(["demo/main.py", "demo-1.0.dist-info/WHEEL", "demo-1.0.dist-info/METADATA",
    ...                 "demo-1.0.dist-info/RECORD"])
    'demo-1.0.dist-info'
    >>> find_dist_info(["demo/main.py", "demo-1.0.dist-info/METADATA"])
    Traceback (most recent call last):
    ...
    ValueError: not a wheel: demo-1.0.dist-info has no WHEEL, RECORD
    """
    dirs = sorted({name.split("/")[0] for name in names if "/" in name and name.split("/")[0].endswith(".dist-info")})
    if not dirs:
        raise ValueError("not a wheel: it has no .dist-info directory (build it with `python -m build --wheel`)")
    if len(dirs) > 1:
        raise ValueError(f"not a wheel: it has more than one .dist-info directory ({', '.join(dirs)})")
    missing = [file for file in REQUIRED_DIST_INFO_FILES if f"{dirs[0]}/{file}" not in names]
    if missing:
        raise ValueError(f"not a wheel: {dirs[0]} has no {', '.join(missing)}")
    return dirs[0]


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
