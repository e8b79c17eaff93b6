"""Budget watchdog: seconds from a job's budget being crossed to the last node of its cluster gone.

Each run is a real job whose code sleeps (harness/wheels.py's sleeper: a cluster that costs this machine nothing but
its processes), on a cluster priced from the catalogue (local and aws: fc2-2018's c4.xlarge workers, lab: its own
lab-w-1g), its nodes reporting to a private server as under `submit_job --inline`. On aws the EC2 API is moto's
server and its instances are lab hosts at the addresses moto gave them (harness/ec2lab.py): the launch, the SSH
bootstrap and the teardown (terminate, wait for terminated, then the network) are the provider's own, but moto
terminates at once where EC2 takes about a minute — the provider's figure for its teardowns (provisioner.PROVIDERS)
until this installation has measured its own. Once it runs, nobody drives it but the sweep
(fc2/services/sweep.py), called every FC2_SWEEP_INTERVAL_S as Celery beat calls it, and its whole-job budget is set so
that its cost (every node, from the launch) reaches it `--margin` seconds after the watchdog would stop it at
once. Times, from that crossing:

- watchdog's rule met: cost so far + $/h × (the sweep interval + the expected teardown) ≥ budget, i.e. that long
  before the crossing (the expected teardown: the median of the provider's teardowns measured so far, shown);
- stopped: the job failed by the sweep, with the reason on its timeline;
- last node gone: the end of its teardown (Job.torn_down_at), checked against the provider (no cluster by its name).

Negative is before the budget was crossed: what the watchdog is for. The wait from the rule being met to the stop is
up to one sweep interval (beat's ticks are not aligned with it: each run starts them at a random phase), then the
teardown.

Runs in a scratch FC2_VAR_DIR (SQLite), removed at the end with any cluster left in it. The lab and aws need root and
the lab's tools (`make lab`); aws needs the dev dependencies (`moto[server]`).

    .venv/bin/python benchmarks/budget_watchdog.py [--provider local|lab|aws] [--repeat 3] [--workers 2] [--margin 8]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from benchmarks._django import setup_django  # noqa: E402

WORKER_TYPE = {"local": "c4.xlarge", "lab": "lab-w-1g", "aws": "c4.xlarge"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", choices=sorted(WORKER_TYPE), default="local")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--margin", type=float, default=8.0, help="seconds from setting the budget to crossing it")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="fc2-bench-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, ignore_errors=True)
        provider_environment: dict[str, str] = {}
        if args.provider == "aws":
            from harness import ec2lab

            moto = ec2lab.MotoServer(scratch / "moto.log")
            stack.callback(moto.stop)
            provider_environment = ec2lab.provider_environment(moto.url, scratch / "ec2-nodes")
        setup_django(scratch, **provider_environment)
        import provisioner

        if reason := provisioner.unavailable(args.provider) or provisioner.unavailable("lab"):
            sys.exit(f"error: {reason}")
        try:
            measure(args, scratch)
        finally:
            for name in provisioner.list_clusters(args.provider):  # this scratch installation's only
                provisioner.teardown(args.provider, name)


def measure(args: argparse.Namespace, scratch: Path) -> None:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    import provisioner
    from fc2.models import Job
    from fc2.services import datasets, inline, jobs, pipeline, pricing, sweep
    from fc2.services.bundles import store_bundle
    from harness.wheels import sleeper_wheel
    from recommender.catalog import load_catalog

    call_command("migrate", verbosity=0)
    for name in ("fc2-2018", "lab"):
        load_catalog(name)
    user = get_user_model().objects.create_user("bench", password="bench-password")
    with sleeper_wheel(scratch).open("rb") as wheel:
        bundle = store_bundle(user, wheel, "demo-1.0-py3-none-any.whl")
    digits = datasets.ready(datasets.resolve(user, "digits"))
    interval = settings.FC2_SWEEP_INTERVAL_S

    print(f"{args.provider}, {args.workers} workers (mirrored), a sweep every {interval} s: the watchdog's rule is met")
    print(f"{interval} s + the expected teardown before the budget is crossed; seconds from the crossing to")
    columns = f"{'expected teardown':>18} {'stopped':>8} {'last node gone':>15} {'(teardown)':>11}"
    print(f"{'run':>3} {'$/h':>6} {'budget':>8} {columns}")
    gone_after: list[float] = []
    teardowns: list[float] = []
    region = settings.FC2_AWS_REGION if args.provider == "aws" else ""
    for run in range(args.repeat):
        request = jobs.JobRequest(
            bundle=bundle, dataset=digits, provider=args.provider, region=region, strategy="mirrored",
            workers=args.workers, worker_type=WORKER_TYPE[args.provider], catalog="fc2-2018",
        )  # fmt: skip
        job = jobs.submit(user, request, driver=Job.Driver.INLINE)
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(inline.report_server())
            if args.provider == "aws":  # the platform at the subnet's gateway, as its instances see it
                from harness.ec2lab import Ec2Lab

                port = urlsplit(url).port
                hosts = stack.enter_context(
                    Ec2Lab(os.environ["AWS_ENDPOINT_URL"], settings.FC2_AWS_VPC_CIDR, port, scratch / "ec2-hosts")
                )
                settings.FC2_PUBLIC_URL = f"http://{hosts.gateway(0)}:{port}"
                settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, hosts.gateway(0)]
            # The nodes' last reports, sent after the watchdog ended the job, are refused (409): expected, not news.
            # (Set here: the server's WSGI app sets Django's logging up again.)
            logging.getLogger("django.request").setLevel(logging.ERROR)
            for step in ("recommend", "provision", "bootstrap"):
                if not pipeline.run_step(step, job.pk, report_url=url):
                    raise SystemExit(f"error: job {job.pk}: {Job.objects.get(pk=job.pk).failure_reason}")
            # Driven by the workers from now on: the sweep watches it.
            Job.objects.filter(pk=job.pk).update(driver=Job.Driver.CELERY, lease_until=None)
            job.refresh_from_db()
            hourly = float(job.hourly_cost)
            ahead = pricing.teardown_s(args.provider)  # what the watchdog expects this teardown to take
            budget = Decimal(str(round(job.cost_so_far + hourly * (args.margin + ahead) / 3600, 4)))
            Job.objects.filter(pk=job.pk).update(total_budget=budget)
            crossed = job.launched_at + timedelta(seconds=float(budget) / hourly * 3600)
            tick = time.monotonic() + random.uniform(0, interval)  # beat's ticks keep their own phase
            while job.state == Job.State.RUNNING:
                time.sleep(max(0.0, tick - time.monotonic()))
                tick += interval  # every interval, however long a sweep takes, as beat sends them
                sweep.sweep()
                job.refresh_from_db()
        stopped = job.events.filter(state=Job.State.FAILED).first().at  # then its teardown's, in the same state
        assert job.failure_reason.startswith("stopped: the job's cost would exceed its budget"), job.failure_reason
        assert job.torn_down_at and job.cluster_name not in provisioner.list_clusters(args.provider, job.region)
        after = [(moment - crossed).total_seconds() for moment in (stopped, job.torn_down_at)]
        gone_after.append(after[1])
        teardowns.append(after[1] - after[0])
        print(
            f"{run + 1:>3} {hourly:>6.3f} {float(budget):>8.4f} {ahead:>17.2f}s {after[0]:>+8.2f} {after[1]:>+15.2f} "
            f"{teardowns[-1]:>10.2f}s"
        )
    print(
        f"median: last node gone {statistics.median(gone_after):+.2f} s from the budget crossed "
        f"(min {min(gone_after):+.2f}, max {max(gone_after):+.2f}); stopped → last node gone "
        f"{statistics.median(teardowns):.2f} s"
    )


if __name__ == "__main__":
    main()
