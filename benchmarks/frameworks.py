"""TensorFlow against PyTorch on the lab: an epoch of the digits example under each, on identical clusters.

The same CNN, parameters and data — examples/digits_cnn under MultiWorkerMirroredStrategy, examples/digits_torch
under DistributedDataParallel (gloo) — each on a lab cluster of 2 workers of one type with one latency between them,
launched one after the other on this machine, bootstrapped as a job's are, their agents keeping their samples on the
nodes. Each framework runs twice, `--short` and `--long` epochs, so that what an epoch costs is the difference
between the two runs over the epochs between them — start-up (imports, joining the cluster, the first step's tracing
or DDP's buckets), evaluation and saving cancel out:

* epoch time: the long run's steady-state `epoch_time_s` (metrics.json);
* bytes per epoch: a worker's bytes out and in (its namespace's counters, as its agent samples them), long − short,
  over the extra epochs, the mean of the 2 workers;
* CPU per epoch: a worker's CPU seconds (its agent's samples: the command's processes, 1 s apart), the same way;
* test accuracy after the long run.

PyTorch runs twice over: as torch sets itself up (one intra-op thread a core of the machine) and with one thread
(`--threads=1`), since lab nodes share this machine's cores and torch's OpenMP threads then wait on each other. Then
the ratio of each figure, PyTorch / TensorFlow. Needs root and the lab's tools (`make lab`) and both wheels (`make
examples`); leaves nothing behind.

    .venv/bin/python benchmarks/frameworks.py [--worker-type lab-w-1g] [--latency-ms 0] [--short 2] [--long 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from benchmarks._django import setup_django  # noqa: E402

setup_django()

import provisioner  # noqa: E402
from provisioner import ClusterSpec, RunSpec  # noqa: E402

DIST = PROJECT_DIR / "examples" / "dist"
WORKERS = ("worker-0", "worker-1")
RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class Framework:
    label: str  # the column's
    name: str  # RunSpec.framework
    strategy: str  # the cluster's
    wheel: Path
    module: str
    params: tuple[str, ...] = ()  # beyond --epochs


TF_WHEEL, TORCH_WHEEL = (DIST / f"fc2_{name}-0.1.0-py3-none-any.whl" for name in ("digits_cnn", "digits_torch"))
FRAMEWORKS = (
    Framework("TF mirrored", "tensorflow", "mirrored", TF_WHEEL, "fc2_digits.main"),
    Framework("torch ddp", "pytorch", "ddp", TORCH_WHEEL, "fc2_digits_torch.main"),
    Framework("ddp 1 thread", "pytorch", "ddp", TORCH_WHEEL, "fc2_digits_torch.main", ("--threads=1",)),
)


@dataclass(frozen=True)
class Run:
    metrics: dict  # worker-0's metrics.json
    bytes: float  # a worker's bytes out + in over the run, the mean of the workers
    cpu_s: float  # a worker's CPU seconds over the run, the mean of the workers


def worker_use(samples: list[dict]) -> tuple[float, float]:
    """(bytes out + in, CPU seconds) of one node between its agent's first and last samples."""
    timed = [s for s in samples if isinstance(s.get("at"), int | float)]
    first, last = timed[0], timed[-1]
    moved = sum(last[key] - first[key] for key in ("bytes_sent", "bytes_recv"))
    cpu_s = sum(
        (b["at"] - a["at"]) * (b.get("cpu_percent") or 0.0) / 100 for a, b in zip(timed, timed[1:], strict=False)
    )
    return moved, cpu_s


def run(framework: Framework, epochs: int, args: argparse.Namespace, dataset: Path) -> Run:
    name = f"fc2-bench-{framework.name}-{len(framework.params)}-{epochs}"
    spec = ClusterSpec(name, "lab", framework.strategy, 2, worker_type=args.worker_type, latency_ms=args.latency_ms)
    cluster = provisioner.launch(spec)
    try:
        params = (f"--epochs={epochs}", *framework.params)
        spec_run = RunSpec(1, str(framework.wheel), framework.module, params, str(dataset), framework=framework.name)
        cluster = provisioner.bootstrap(cluster, spec_run)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not set(WORKERS) <= set(results := provisioner.fetch_results(cluster)):
            if time.monotonic() > deadline:
                sys.exit(f"error: {framework.name}, {epochs} epochs: not done within {RUN_TIMEOUT_S} s")
            time.sleep(1)
        failed = {n: results[n].report.get("exit_code") for n in WORKERS if results[n].report.get("exit_code") != 0}
        if failed:
            sys.exit(f"error: {framework.name}, {epochs} epochs: exit codes {failed}: {results['worker-0'].report}")
        use = [worker_use(provisioner.kept_samples(cluster, node)) for node in WORKERS]
        metrics = json.loads(results["worker-0"].outputs["metrics.json"])
        return Run(metrics, sum(u[0] for u in use) / len(use), sum(u[1] for u in use) / len(use))
    finally:
        provisioner.teardown("lab", name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-type", default="lab-w-1g", help="the workers' lab type (default: lab-w-1g)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="between the nodes (default: 0)")
    parser.add_argument("--short", type=int, default=2, help="epochs of the short run (default: 2)")
    parser.add_argument("--long", type=int, default=32, help="epochs of the long run (default: 32)")
    args = parser.parse_args()
    if reason := provisioner.unavailable("lab"):
        sys.exit(f"error: {reason}")
    if missing := [str(f.wheel) for f in FRAMEWORKS if not f.wheel.exists()]:
        sys.exit(f"error: {', '.join(missing)} missing: `make examples` builds them")
    if not 0 < args.short < args.long:
        sys.exit("error: --short must be at least 1 and less than --long")
    from fc2.services import datasets

    dataset = datasets.materialise_builtin("digits")
    extra = args.long - args.short

    figures = []
    for framework in FRAMEWORKS:
        short, long = run(framework, args.short, args, dataset), run(framework, args.long, args, dataset)
        figures.append(
            {
                "epoch_time_s": long.metrics["epoch_time_s"],
                "bytes_per_epoch": (long.bytes - short.bytes) / extra / 1000,
                "cpu_s_per_epoch": (long.cpu_s - short.cpu_s) / extra,
                "test_accuracy": long.metrics["test_accuracy"],
            }
        )
    steps = long.metrics["steps_per_epoch"]
    print(
        f"digits CNN, 2 × {args.worker_type}, latency {args.latency_ms:g} ms, batch 32 a worker, {steps} steps an "
        f"epoch; per epoch from {args.long} − {args.short} epochs; ratios to TensorFlow's:"
    )
    print(f"{'':26}" + "".join(f"{f.label:>14}" for f in FRAMEWORKS) + "".join(f"{'÷ TF':>8}" for _ in FRAMEWORKS[1:]))
    rows = (
        ("epoch time (s)", "epoch_time_s", "{:.3f}"),
        ("bytes a worker (KB)", "bytes_per_epoch", "{:.1f}"),
        ("CPU a worker (s)", "cpu_s_per_epoch", "{:.3f}"),
        (f"test accuracy ({args.long} ep.)", "test_accuracy", "{:.3f}"),
    )
    tf = figures[0]
    for label, key, shape in rows:
        values = "".join(f"{shape.format(f[key]):>14}" for f in figures)
        ratios = "".join(f"{f[key] / tf[key] if tf[key] else float('nan'):>8.2f}" for f in figures[1:])
        print(f"{label:26}{values}{ratios}")


if __name__ == "__main__":
    main()
