"""Managed jobs' resume on the lab, judged by its model: a resumed job's test accuracy beside an uninterrupted one's.

Issue 45 §2 asks that the final model of a job resumed after a lost node be that of an uninterrupted run, within
noise. Per seed this runs the example bundle (examples/digits_cnn, built as `make examples` does; scikit-learn's
digits) twice as a 2-worker mirrored job on lab-w-1g workers, EPOCHS epochs, max_restarts 1, on the platform's normal
path — submitted, driven by a real Celery worker, the sweep run every half second (tests/test_resume.py's lab case):

- uninterrupted: it runs to its end;
- resumed: once the chief has shipped a checkpoint of epoch EPOCHS // 2 or later and trains on, worker-1's host is
  destroyed (its namespace and processes); the platform sees the loss after FC2_NODE_UNREACHABLE_S (10 s here), makes
  the cluster again and starts every node from the latest checkpoint.

Figures, per run: the final test accuracy (the chief's metrics.json) and the job's cost; for the resumed one, the epochs
done again (the chief's last step before the loss less the checkpoint's it resumed from: a progress line every step,
in both runs, so that the count is exact), the seconds from the loss to the nodes started again (the restart's
`resumed_at`) and the lost work's share of the cost. The summary gives the accuracy difference beside the noise: how
far apart the uninterrupted runs of the seeds are.

It runs in a scratch FC2_VAR_DIR and pytest --basetemp, so nothing of the developer's var/ is touched; root is needed
(the lab), as for `make test`. The runs are this file's test, run by pytest with tests/conftest.py's fixtures.

    .venv/bin/python benchmarks/resume_model.py [--runs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parent.parent
pytest_plugins = ["tests.conftest"]  # the fixtures of the tests, for this file's test (it lives outside tests/)
SEED_ENV = "FC2_RESUME_MODEL_SEED"  # the seed of one pytest run of this file's test
FIRST_SEED = 42  # the example's default; run N uses FIRST_SEED + N - 1
EPOCHS = 8
WORKER_TYPE = "lab-w-1g"  # the lab's fastest link: the example's all-reduce is not held back by it


def job_figures(job, **extra) -> dict:
    """What a finished job says of its model and cost."""
    metrics = job.metrics or {}
    cost = job.cost_so_far
    return {
        "state": job.state,
        "test_accuracy": metrics.get("test_accuracy"),
        "epochs": metrics.get("epochs"),
        "cost": round(cost, 6) if cost is not None else None,
        **extra,
    }


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_resumed_and_uninterrupted_models(alice, bundle, digits, workers, settings):
    """One seed: the example uninterrupted, then the same with worker-1's host destroyed mid-training."""
    from django.utils import timezone

    import provisioner
    from fc2.models import Job
    from fc2.services import checkpoints, jobs
    from monitor.models import LossPoint
    from provisioner import ClusterInfo
    from recommender.catalog import load_catalog
    from tests import test_node_loss as losses
    from tests.conftest import wait_for

    missing = provisioner.unavailable("lab")
    assert not missing, missing
    settings.FC2_NODE_SILENCE_S = losses.SILENCE_S
    settings.FC2_NODE_LOST_S = settings.FC2_NODE_UNREACHABLE_S = losses.LOST_S
    workers.env["FC2_WORKERS_FINISH_S"] = "5"
    load_catalog("lab")
    workers.start()
    seed = int(os.environ.get(SEED_ENV, FIRST_SEED))

    def submit() -> Job:
        request = jobs.JobRequest(
            bundle=bundle, dataset=digits, strategy="mirrored", workers=2, provider="lab", worker_type=WORKER_TYPE,
            max_restarts=1, parameters={"epochs": str(EPOCHS), "seed": str(seed), "log_every_steps": "1"},
        )  # fmt: skip
        return jobs.submit(alice, request, driver=Job.Driver.CELERY)

    def chief_epoch(job: Job) -> int:
        point = LossPoint.objects.filter(node__job=job, node__name="worker-0").order_by("-at", "-pk").first()
        return point.epoch if point else 0

    def finished(job: Job, within_s: float) -> Job:
        job = losses.sweep_until(job, lambda j: j.is_terminal, within_s)
        losses.sweep_until(job, lambda j: j.cluster is None, losses.RELEASED_WITHIN_S)
        return Job.objects.get(pk=job.pk)

    plain = finished(submit(), 600)
    assert plain.state == Job.State.SUCCEEDED, (plain.failure_reason, workers.logs())

    job = submit()

    def midway_and_past_a_checkpoint() -> bool:
        done = Job.objects.get(pk=job.pk)
        return done.is_terminal or (checkpoints.latest(done) is not None and chief_epoch(done) > EPOCHS // 2)

    wait_for(midway_and_past_a_checkpoint, "midway, past a shipped checkpoint", workers)
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING, (job.state, job.failure_reason, workers.logs())
    losses.host_gone(ClusterInfo.from_dict(job.cluster), losses.VICTIM)
    killed_at = timezone.now()
    job = finished(job, 600)
    assert job.state == Job.State.SUCCEEDED, (job.failure_reason, workers.logs())
    (restart,) = job.restarts
    steps_per_epoch = job.metrics["steps_per_epoch"]
    before = LossPoint.objects.filter(node__job=job, node__name="worker-0", at__lt=restart["at"])
    redone_steps = max(p.step for p in before) - job.metrics["resumed_at_step"]
    resumed = job_figures(
        job,
        epochs_again=round(redone_steps / steps_per_epoch, 2),
        training_again_s=round((datetime.fromisoformat(restart["resumed_at"]) - killed_at).total_seconds(), 1),
        checkpoint=restart["checkpoint"],
        lost_dollars=restart["lost_dollars"],
    )
    figure = {"seed": seed, "epochs": EPOCHS, "uninterrupted": job_figures(plain), "resumed": resumed}
    print(f"\nFIGURE resume_model {json.dumps(figure)}")


def run(seed: int, scratch: Path) -> tuple[dict | None, str]:
    """One seed's pair of runs: its FIGURE (None if it failed) and what pytest printed last."""
    env = {**os.environ, "DEBUG": "1", "FC2_VAR_DIR": str(scratch / "var"), SEED_ENV: str(seed)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    command += [f"--basetemp={scratch / 'pt'}", "-q", "-s", "-x", f"{Path(__file__).resolve()}"]
    done = subprocess.run(command, cwd=PROJECT_DIR, env=env, capture_output=True, text=True)
    marker = "FIGURE resume_model "
    figures = [line.split(marker, 1)[1] for line in done.stdout.splitlines() if marker in line]
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
    if done.returncode != 0 or not figures:
        return None, tail
    return json.loads(figures[-1]), tail


def describe(row: dict) -> str:
    plain, resumed = row["uninterrupted"], row["resumed"]
    difference = resumed["test_accuracy"] - plain["test_accuracy"]
    return (
        f"seed {row['seed']}: test accuracy {plain['test_accuracy']:.4f} uninterrupted, "
        f"{resumed['test_accuracy']:.4f} resumed (difference {difference:+.4f}); "
        f"{resumed['epochs_again']:g} epochs done again; training again {resumed['training_again_s']:.1f} s after "
        f"the loss; cost ${plain['cost']:.4f} uninterrupted, ${resumed['cost']:.4f} resumed "
        f"(${resumed['lost_dollars']:.4f} of it lost work)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="seeds, each run uninterrupted and resumed (default 1)")
    parser.add_argument("--json", action="store_true", help="one JSON object of every run and the summary")
    args = parser.parse_args()
    rows: list[dict] = []
    failures: list[dict] = []
    for number in range(args.runs):
        seed = FIRST_SEED + number
        with tempfile.TemporaryDirectory(prefix="fc2-resume-model-") as scratch:
            figure, tail = run(seed, Path(scratch))
        if figure is None:
            failures.append({"seed": seed, "tail": tail})
            if not args.json:
                print(f"seed {seed}: FAILED\n{tail}", flush=True)
            continue
        rows.append(figure)
        if not args.json:
            print(describe(figure), flush=True)
    summary: dict = {"runs": len(rows), "failed": len(failures), "epochs": EPOCHS}
    if rows:
        plains = [r["uninterrupted"]["test_accuracy"] for r in rows]
        differences = [r["resumed"]["test_accuracy"] - plain for r, plain in zip(rows, plains, strict=True)]
        summary |= {
            "accuracy_uninterrupted_median": statistics.median(plains),
            "accuracy_resumed_median": statistics.median(r["resumed"]["test_accuracy"] for r in rows),
            # the noise to judge the difference by: how far the uninterrupted runs of different seeds are apart
            "accuracy_uninterrupted_range": max(plains) - min(plains),
            "difference_median": statistics.median(differences),
            "difference_largest": max(differences, key=abs),
            "epochs_again_median": statistics.median(r["resumed"]["epochs_again"] for r in rows),
            "training_again_s_median": statistics.median(r["resumed"]["training_again_s"] for r in rows),
        }
    if args.json:
        print(json.dumps({"runs": rows, "failures": failures, "summary": summary}))
    elif rows:
        print(
            f"\n{len(rows)} seeds, medians: test accuracy {summary['accuracy_uninterrupted_median']:.4f} "
            f"uninterrupted, {summary['accuracy_resumed_median']:.4f} resumed; difference "
            f"{summary['difference_median']:+.4f} ({summary['difference_largest']:+.4f} the largest; the seeds' "
            f"uninterrupted accuracies {summary['accuracy_uninterrupted_range']:.4f} apart); "
            f"{summary['epochs_again_median']:g} epochs done again; "
            f"training again {summary['training_again_s_median']:.1f} s after the loss"
        )
    return 0 if rows and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
