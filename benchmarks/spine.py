"""Spine figures on the local provider: time from submit to every node process started, and whole-job wall time.

"Started" is each node agent's first report, sent before the training code imports TensorFlow, so TensorFlow's
import (~5 s per process) is excluded as the goal asks (≤ 5 s for 2 workers). The job wall time includes everything:
submit, venv + wheel install, TensorFlow import on every node, training, artifact upload, teardown.

Runs in a scratch FC2_VAR_DIR (SQLite, nothing of the developer's var/ is touched):

    .venv/bin/python benchmarks/spine.py [--repeat 2] [--strategies ps,mirrored]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from benchmarks._django import setup_django  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--strategies", default="ps,mirrored")
    args = parser.parse_args()

    scratch = setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from fc2.models import Job
    from fc2.services import datasets, inline, jobs
    from fc2.services.bundles import store_bundle

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="bench-password")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(scratch),
         str(PROJECT_DIR / "examples" / "digits_cnn")],
        check=True,
    )  # fmt: skip
    wheel = next(scratch.glob("*.whl"))
    with wheel.open("rb") as f:
        bundle = store_bundle(user, f, wheel.name)
    digits = datasets.ready(datasets.resolve(user, "digits"))

    print(f"{'strategy':<9} {'run':>3} {'submit→all nodes started':>25} {'of which bootstrap':>19} {'job wall':>9}")
    results: dict[str, list[tuple[float, float]]] = {}
    for strategy in args.strategies.split(","):
        for run in range(args.repeat):
            t0 = time.monotonic()
            request = jobs.JobRequest(bundle=bundle, dataset=digits, parameters={"epochs": "1"}, strategy=strategy)
            job = jobs.submit(user, request, driver=Job.Driver.INLINE)
            job = inline.run_inline(job.pk, poll_s=0.2)
            wall = time.monotonic() - t0
            assert job.state == Job.State.SUCCEEDED, job.failure_reason
            started = max(n.started_at for n in job.nodes.all())
            to_started = (started - job.created_at).total_seconds()
            boot = job.events.get(state="bootstrapping").at
            boot_s = (job.events.filter(state="running").first().at - boot).total_seconds()
            results.setdefault(strategy, []).append((to_started, wall))
            print(f"{strategy:<9} {run + 1:>3} {to_started:>23.2f} s {boot_s:>17.2f} s {wall:>7.1f} s")
    for strategy, rows in results.items():
        started = statistics.median(r[0] for r in rows)
        wall = statistics.median(r[1] for r in rows)
        print(
            f"median {strategy}: submit→all node processes started {started:.2f} s (goal ≤ 5 s); "
            f"whole 2-worker digits job {wall:.1f} s"
        )


if __name__ == "__main__":
    main()
