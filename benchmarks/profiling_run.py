"""Scala-Opt's profiling run on the lab: its duration and the b_t it measures, for each worker type asked.

A real Scala-Opt job of the example bundle (examples/digits_cnn) on the lab, for a workload with no bandwidth
records, L^w = the types given: its recommend step runs one profiling run per type (1 PS + 1 worker of that type, the
user's code, fc2/services/profiling.py), keeps each b_t as a record (source: profiled) and chooses the cluster by them —
the step is run here as the pipeline runs it, and stops there (no cluster is launched after it). Prints, per type:
the profiling run's wall time (launch to teardown), its $/h, what it cost the job, and b_t; then Scala-Opt's answer.

Runs in a scratch FC2_VAR_DIR (SQLite), removed at the end with any cluster left in it. Needs root and the lab's tools
(`make lab`) and the example wheel (`make examples`).

    .venv/bin/python benchmarks/profiling_run.py [--types lab-w-250,lab-w-1g] [--ps-type lab-ps-450]
        [--busy-s 10] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from datetime import datetime
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from benchmarks._django import setup_django  # noqa: E402

WHEEL = PROJECT_DIR / "examples" / "dist" / "fc2_digits_cnn-0.1.0-py3-none-any.whl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="lab-w-250,lab-w-1g", help="worker types (L^w), comma-separated")
    parser.add_argument("--ps-type", default="lab-ps-450")
    parser.add_argument("--busy-s", type=int, default=10, help="FC2_PROFILE_BUSY_S: seconds of traffic to measure")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    if not WHEEL.is_file():
        sys.exit(f"error: {WHEEL} is missing (make examples)")

    scratch = Path(tempfile.mkdtemp(prefix="fc2-bench-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, ignore_errors=True)
        setup_django(scratch, FC2_PROFILE_BUSY_S=str(args.busy_s), FC2_PROFILE_S="180")
        import provisioner

        if reason := provisioner.unavailable("lab"):
            sys.exit(f"error: {reason}")
        try:
            measure(args)
        finally:
            for name in provisioner.list_clusters("lab"):  # this scratch installation's only
                provisioner.teardown("lab", name)


def measure(args: argparse.Namespace) -> None:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from fc2.models import Job
    from fc2.services import datasets, jobs, pipeline
    from fc2.services.bundles import store_bundle
    from recommender.catalog import load_catalog

    call_command("migrate", verbosity=0)
    load_catalog("lab")
    user = get_user_model().objects.create_user("bench", password="bench-password")
    with WHEEL.open("rb") as wheel:
        bundle = store_bundle(user, wheel, WHEEL.name)
    request = jobs.JobRequest(
        bundle=bundle, dataset=datasets.ready(datasets.resolve(user, "digits")), provider="lab", catalog="lab",
        strategy="ps", algorithm="scala-opt", workers=4, ps_type=args.ps_type,
        worker_types=args.types.split(","), workload_name="bench-profiling",
        parameters={"epochs": "1", "steps_per_epoch": "2000", "batch_size": str(args.batch_size)},
    )  # fmt: skip
    job = jobs.submit(user, request, driver=Job.Driver.INLINE)
    if not pipeline.run_step("recommend", job.pk):
        raise SystemExit(f"error: {Job.objects.get(pk=job.pk).failure_reason}")
    job.refresh_from_db()

    print(f"Scala-Opt's profiling runs on the lab: 1 {args.ps_type} PS + 1 worker, batch size {args.batch_size}, "
          f"until {args.busy_s} s of the worker's traffic are measured")  # fmt: skip
    print(f"{'worker type':>12} {'wall s':>7} {'$/h':>7} {'cost $':>9} {'b_t Mbps':>9}")
    total = 0.0
    for run in job.profiling_runs:
        took = (datetime.fromisoformat(run["ended_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()
        cost = run["hourly_cost"] * took / 3600
        total += cost
        hourly, b_t = run["hourly_cost"], run["bandwidth_mbps"]
        print(f"{run['worker_type']:>12} {took:>7.1f} {hourly:>7.3f} {cost:>9.5f} {b_t:>9.2f}")
    print(f"billed to the job: ${total:.5f} (its cost so far: ${job.cost_so_far:.5f})")
    print(f"Scala-Opt then chose: {job.workers} × {job.worker_type} — {job.recommendation['explanation']}")


if __name__ == "__main__":
    main()
