"""`manage.py lab_sweep`: run a grid of real jobs on the lab and keep each one's epoch time as a performance record.

    lab_sweep --bundle PATH --dataset NAME --workers 1,2,3 --batch-sizes 32,64 --latency-ms 0,40,80
              [--worker-type T] [--ps-type T] [--framework tensorflow|pytorch] [--strategy ps|mirrored|ddp]
              --workload NAME [--param K=V …] [--csv PATH] [--json]

What Anwar et al. measured by hand (epoch time for each worker count, batch size and network latency, §5.2.3) and
FC² for each PS capacity (§8.2): each cell is a job on lab nodes whose links have the types' capacities and, between
them, the latency asked for; it runs in this process (as `submit_job --inline`), one after the other, and its
measurement becomes a record of the workload (source: measured) that `recommend --algorithm lookup|model` reads. A
cell whose job failed is recorded as a failed run. Interrupted (Ctrl-C or SIGTERM), the running cell's job is
cancelled and its cluster torn down before the command exits.

A PyTorch bundle (its wheel requires torch, or `--framework pytorch`) is swept as DistributedDataParallel (strategy
ddp, the one PyTorch has); its records go under the workload's PyTorch key (`NAME@pytorch`,
recommender.types.workload_key), so that they never mix with a TensorFlow grid of the same name. The output's
`workload` is the key they went under.

Each cell reports its record's epoch time, bandwidth and CPU use. `--csv PATH` also writes the sweep's records, once
it has run every cell, in `import_perf_data --format csv`'s format (recommender.perfdata.to_csv): a grid to ship in
recommender/data/ or to import on another platform. PATH's folder must exist: that is checked before the first cell.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from django.contrib.auth import get_user_model

from fc2.bundles import BundleError
from fc2.management.commands.submit_job import add_framework_arguments
from fc2.models import Job
from fc2.services import datasets, inline, jobs
from recommender.management.base import ContractCommand
from recommender.models import PerformanceRecord
from recommender.perfdata import to_csv

RECORD_FIELDS = ("epoch_time_s", "bandwidth_mbps", "cpu_util")  # each cell's, from its record (None without one)


def _numbers(kind):
    def parse(text: str) -> list:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"{text!r} is not a comma-separated list of numbers") from None
        if not values or any(v < 0 for v in values):
            raise ValueError(f"{text!r}: give at least one number, none negative")
        return values

    return parse


class Command(ContractCommand):
    help = "Run a grid of real lab jobs (workers × batch sizes × latencies) and record each one's epoch time."

    def add_arguments(self, parser):
        parser.add_argument("--bundle", required=True, metavar="PATH", help="path of the wheel")
        parser.add_argument("--main", default="main.py", metavar="SCRIPT", help="the main script (default: main.py)")
        parser.add_argument("--dataset", required=True, metavar="NAME|URL", help="a dataset, as for submit_job")
        parser.add_argument("--workers", required=True, metavar="N,N,…", help="worker counts, e.g. 1,2,3,4")
        parser.add_argument(
            "--batch-sizes", required=True, metavar="B,B,…", help="batch sizes, passed as --batch_size=B"
        )
        parser.add_argument("--latency-ms", default="0", metavar="L,L,…", help="latencies between nodes (default: 0)")
        parser.add_argument("--worker-type", default="", metavar="TYPE", help="lab worker type (default: the first)")
        parser.add_argument("--ps-type", default="", metavar="TYPE", help="lab PS type (default: the worker type)")
        add_framework_arguments(parser, "each cell's cluster, as submit_job's")
        parser.add_argument("--workload", required=True, metavar="NAME", help="the records' workload name")
        parser.add_argument("--param", action="append", default=[], metavar="K=V", help="a parameter (repeatable)")
        parser.add_argument("--user", default="researcher", help="username the jobs belong to (default: researcher)")
        parser.add_argument("--csv", default="", metavar="PATH", help="also write the records there (csv format)")
        parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

    def handle(self, *args, **options):
        as_json = options["json"]
        try:
            workers = _numbers(int)(options["workers"])
            batch_sizes = _numbers(int)(options["batch_sizes"])
            latencies = _numbers(float)(options["latency_ms"])
            csv_path = _csv_path(options["csv"])
            owner = get_user_model().objects.get(username=options["user"])
            dataset = datasets.ready(datasets.resolve(owner, options["dataset"]))
            parameters = jobs.parse_parameters(options["param"])
        except (ValueError, datasets.DatasetError, jobs.SubmitError) as exc:
            self.fail(str(exc), as_json)
        except get_user_model().DoesNotExist:
            self.fail(f"no user {options['user']!r}", as_json)

        cells, records, workload = [], [], options["workload"]
        for latency in latencies:
            for batch_size in batch_sizes:
                for count in workers:
                    try:
                        job = self._submit(owner, dataset, parameters, count, batch_size, latency, options)
                    except (BundleError, jobs.SubmitError, OSError) as exc:
                        self.fail(str(exc), as_json, cells=cells)
                    job, workload = inline.run_inline(job.pk), job.workload
                    measured = PerformanceRecord.Source.MEASURED
                    record = PerformanceRecord.objects.filter(job_link__job=job, source=measured).first()
                    cell = {
                        "workers": count,
                        "batch_size": batch_size,
                        "latency_ms": latency,
                        "job": job.pk,
                        "status": job.state,
                        **{name: getattr(record, name, None) for name in RECORD_FIELDS},
                    }
                    cells.append(cell)
                    records += [record] if record else []
                    if not as_json:
                        time = f"{cell['epoch_time_s']:.3f} s" if cell["epoch_time_s"] else job.state
                        self.stderr.write(
                            f"workers {count:>3}  batch {batch_size:>6}  latency {latency:>6g} ms  {time}"
                        )
        out = {"workload": workload, "cells": cells}
        if csv_path is not None:
            _write(csv_path, to_csv(records))
            out["csv"] = str(csv_path)
        self.stdout.write(json.dumps(out) if as_json else _table(cells))

    def _submit(self, owner, dataset, parameters, workers, batch_size, latency, options) -> Job:
        with Path(options["bundle"]).open("rb") as wheel:
            return jobs.submit_upload(
                owner,
                wheel,
                Path(options["bundle"]).name,
                options["main"],
                dataset=dataset,
                driver=Job.Driver.INLINE,
                parameters={**parameters, "batch_size": str(batch_size)},
                provider="lab",
                framework=options["framework"],
                strategy=options["strategy"],
                workers=workers,
                ps_type=options["ps_type"],
                worker_type=options["worker_type"],
                latency_ms=latency,
                workload_name=options["workload"],
            )


def _csv_path(text: str) -> Path | None:
    """--csv's file, checked before the sweep spends its hours: its folder exists and it is not a folder itself."""
    if not text:
        return None
    path = Path(text).expanduser().resolve()
    if not path.parent.is_dir():
        raise ValueError(f"--csv {text}: no folder {path.parent}")
    if path.is_dir():
        raise ValueError(f"--csv {text}: is a folder, not a file")
    return path


def _write(path: Path, text: str) -> None:
    """All or nothing: a temporary file beside it, renamed over it."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _table(cells: list[dict]) -> str:
    """Epoch time (s) per worker count (rows) and latency × batch size (columns)."""
    columns = sorted({(c["latency_ms"], c["batch_size"]) for c in cells})
    rows = sorted({c["workers"] for c in cells})
    cell = {(c["workers"], c["latency_ms"], c["batch_size"]): c for c in cells}
    header = "workers | " + " | ".join(f"{lat:g} ms, batch {b}" for lat, b in columns)
    lines = [header, "-" * len(header)]
    for n in rows:
        values = []
        for lat, b in columns:
            found = cell.get((n, lat, b))
            values.append(f"{found['epoch_time_s']:.3f}" if found and found["epoch_time_s"] else "failed")
        lines.append(f"{n:>7} | " + " | ".join(values))
    return "\n".join(lines)
