"""Bootstrap time of a lab cluster: its nodes all at once (as the platform does) against one after another, in one run.

A 3-node lab cluster (mirrored, lab-w-1g) is launched, then bootstrapped over SSH with the example wheel and the
digits dataset — wait for SSH, copy the agent, the wheel and the dataset, install the wheel into a fresh env on every
node, start the agents — first with every node at once, then (on a second cluster) one node after another
(provisioner.nodes.PARALLEL_NODES = 1). The agents report to a closed port and are torn down with the cluster; what is
timed is the bootstrap alone. Needs root and the lab's tools (`make lab`); leaves nothing behind.

    .venv/bin/python benchmarks/lab_bootstrap.py [--nodes 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from benchmarks._django import setup_django  # noqa: E402

VAR_DIR = setup_django()

import provisioner  # noqa: E402
from provisioner import ClusterSpec, RunSpec, nodes  # noqa: E402

WHEEL = PROJECT_DIR / "examples" / "dist" / "fc2_digits_cnn-0.1.0-py3-none-any.whl"


def timed_bootstrap(name: str, count: int, parallel: int, dataset: Path) -> float:
    cluster = provisioner.launch(ClusterSpec(name, "lab", "mirrored", count, worker_type="lab-w-1g"))
    run = RunSpec(1, str(WHEEL), "fc2_digits_cnn.main", dataset=str(dataset), report_url="http://127.0.0.1:9")
    nodes.PARALLEL_NODES = parallel
    try:
        started = time.monotonic()
        provisioner.bootstrap(cluster, run)
        return time.monotonic() - started
    finally:
        provisioner.teardown("lab", name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args()
    if reason := provisioner.unavailable("lab"):
        sys.exit(f"error: {reason}")
    if not WHEEL.exists():
        sys.exit(f"error: {WHEEL} is missing: `make examples` builds it")
    dataset = VAR_DIR / "digits.npz"
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    np.savez(dataset, x=digits.images, y=digits.target)

    together = timed_bootstrap("fc2-bench-parallel", args.nodes, args.nodes, dataset)
    one_by_one = timed_bootstrap("fc2-bench-serial", args.nodes, 1, dataset)
    print(f"lab bootstrap of {args.nodes} nodes (SSH, copy agent + wheel + dataset, install, start):")
    print(f"  all at once        {together:6.2f} s")
    print(f"  one after another  {one_by_one:6.2f} s")
    print(f"  speed-up           {one_by_one / together:6.2f}x")


if __name__ == "__main__":
    main()
