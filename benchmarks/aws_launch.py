"""EC2 API calls and wall time of the aws provider against moto's EC2 server, in one run:

- launch of a cluster of 1 PS + N workers (default 4) in a VPC of its own, and its teardown to nothing;
- a second launch of the same name (idempotent: describes, creates nothing);
- the reaper (the sweep's reap_orphans) finding and removing a leftover cluster that no job records.

moto answers in milliseconds where EC2 takes tens of seconds to start an instance, so the wall times are the
platform's own overhead; the call counts are what EC2 would see. Needs the dev dependencies (`moto[server]`); leaves
nothing behind.

    .venv/bin/python benchmarks/aws_launch.py [--workers 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from benchmarks._django import setup_django  # noqa: E402

VAR_DIR = setup_django(
    FC2_AWS_PLACEMENT_GROUPS="0",  # moto has none
    FC2_AWS_SSH_ADDRESS="private",  # moto's instances have private addresses only
    FC2_PUBLIC_URL="http://fc2-platform.invalid",
    AWS_ACCESS_KEY_ID="benchmark",
    AWS_SECRET_ACCESS_KEY="benchmark",
)

from django.core.management import call_command  # noqa: E402

from common import awsapi  # noqa: E402
from fc2.services import sweep  # noqa: E402
from harness.ec2lab import REGION, MotoServer  # noqa: E402
from provisioner import ClusterSpec, aws  # noqa: E402


def measured(what: str, call) -> object:
    awsapi.CALLS.clear()
    started = time.monotonic()
    result = call()
    seconds = time.monotonic() - started
    calls = sum(awsapi.CALLS.values())
    top = ", ".join(f"{name} {count}" for name, count in awsapi.CALLS.most_common(4))
    print(f"{what:<34} {calls:>4} API calls {seconds:>7.2f} s   ({top})")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    server = MotoServer(VAR_DIR / "moto.log")
    os.environ["AWS_ENDPOINT_URL"] = server.url
    try:
        spec = ClusterSpec("fc2-bench-launch", "aws", "ps", args.workers, ps_type="m4.large", worker_type="c4.xlarge")
        print(f"1 PS + {args.workers} workers (m4.large + c4.xlarge) in {REGION}, moto {server.url}")
        measured("launch", lambda: aws.launch(spec))
        measured("launch again (idempotent)", lambda: aws.launch(spec))
        removed = measured("teardown", lambda: aws.teardown(spec.cluster_id, REGION))
        print(f"  removed {len(removed)} resources; left: {aws.list_clusters(REGION) or 'nothing'}")
        leftover = ClusterSpec("fc2-999999-0badcafe", "aws", "ps", args.workers, worker_type="c4.xlarge")
        aws.launch(leftover)
        reaped = measured("reaper: find and remove a leftover", sweep.reap_orphans)
        names = [reaping.cluster_name for reaping in reaped]
        print(f"  reaped {names}; left: {aws.list_clusters(REGION) or 'nothing'}")
    finally:
        for name in aws.list_clusters(REGION):
            aws.teardown(name, REGION)
        server.stop()


if __name__ == "__main__":
    main()
