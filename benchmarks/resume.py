"""Managed jobs' resume on the lab: seconds from a node's loss to training again, and the work lost per interruption.

Each run is tests/test_resume.py's lab case, for real: a 2-worker mirrored job (max_restarts 1) of a trainer under the
checkpoint contract — a step every half second, each only while its peer answers (as all-reduce stalls on a lost
one), its chief checkpointing every 6 steps (3 s), shipped to the platform by its agent — driven by a real Celery
worker with the sweep every half second; once a checkpoint is shipped and the chief has trained past it, worker-1's
host is destroyed (its namespace and processes) or its link taken down. The platform sees the loss once the node has
neither reported nor answered for FC2_NODE_UNREACHABLE_S (10 s here; 40 s by default), makes the cluster again and
starts every node from the latest checkpoint. Figures, per run:

- training again: seconds from the loss to the nodes started again (the restart's `resumed_at`); goal within 60 s;
- lost at the loss: the chief's steps done before the loss and done again after it (its last step before the loss
  was seen, less the checkpoint's step it resumed from); goal at most one checkpoint interval (6 steps);
- recorded: what the restart records on the job and its timeline (steps, seconds and $ since the checkpoint, the
  stall until the loss was seen included: billed, and counted in the job's cost and budget).

It runs in a scratch FC2_VAR_DIR and pytest --basetemp, so nothing of the developer's var/ is touched; root is needed
(the lab), as for `make test`.

    .venv/bin/python benchmarks/resume.py [--runs N] [--fault "host gone"|"link down"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
TEST = "tests/test_resume.py::test_a_lab_worker_lost_mid_training_resumes_from_the_checkpoint_and_succeeds"
FAULTS = ("host gone", "link down")
GOAL_S = 60  # training again within this long of the loss


def run(fault: str, scratch: Path) -> tuple[dict | None, str]:
    """One run of the lab case: its FIGURE (None if it failed) and what pytest printed last."""
    env = {**os.environ, "DEBUG": "1", "FC2_VAR_DIR": str(scratch / "var")}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={scratch / 'pt'}"]
    command += ["-q", "-s", "-x", f"{TEST}[{fault}]"]
    done = subprocess.run(command, cwd=PROJECT_DIR, env=env, capture_output=True, text=True)
    figures = [line.split("FIGURE resume ", 1)[1] for line in done.stdout.splitlines() if "FIGURE resume " in line]
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
    if done.returncode != 0 or not figures:
        return None, tail
    return json.loads(figures[-1]), tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of each fault (default 1)")
    parser.add_argument("--fault", choices=FAULTS, action="append", help="only this fault (repeatable; default both)")
    args = parser.parse_args()
    rows: list[dict] = []
    failed = 0
    for fault in args.fault or FAULTS:
        for number in range(1, args.runs + 1):
            with tempfile.TemporaryDirectory(prefix="fc2-resume-") as scratch:
                figure, tail = run(fault, Path(scratch))
            if figure is None:
                failed += 1
                print(f"{fault} #{number}: FAILED\n{tail}", flush=True)
                continue
            rows.append(figure)
            recorded = figure["recorded"]
            print(
                f"{fault} #{number}: training again {figure['training_again_s']:.1f} s after the loss; "
                f"{figure['lost_steps_at_loss']} steps lost at the loss (a checkpoint every "
                f"{figure['checkpoint_every']}); "
                f"recorded {recorded['lost_steps']} steps, {recorded['lost_s']:.1f} s since the checkpoint",
                flush=True,
            )
    if rows:
        again = [row["training_again_s"] for row in rows]
        lost = [row["lost_steps_at_loss"] for row in rows]
        every = rows[0]["checkpoint_every"]
        print(
            f"\n{len(rows)} runs: training again after {statistics.median(again):.1f} s median, {max(again):.1f} s "
            f"at most (goal {GOAL_S} s); {statistics.median(lost):g} steps lost median, {max(lost)} at most "
            f"(goal {every}, one checkpoint interval)"
        )
    met = bool(rows) and all(
        r["training_again_s"] <= GOAL_S and r["lost_steps_at_loss"] <= r["checkpoint_every"] for r in rows
    )
    return 0 if met and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
