"""`manage.py import_perf_data PATH --format anwar2021|csv [--workload NAME] [--owner USERNAME] [--json]`: records
imported by an operator are the platform's (every user's answers read them) unless `--owner` makes them one user's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandParser

from recommender.management.base import ContractCommand, user_named
from recommender.perfdata import FORMATS, PerfDataError, import_file


class Command(ContractCommand):
    help = "Import performance records (all rows or none); re-importing a file replaces its earlier records."
    requires_system_checks = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="the CSV file")
        parser.add_argument(
            "--format",
            required=True,
            choices=FORMATS,
            help="anwar2021: headerless rows workers,batch_size,latency_ms,step_time_s,epoch_time_s,loss; "
            "csv: a header row naming DESIGN.md's columns",
        )
        parser.add_argument(
            "--workload",
            metavar="NAME",
            help="the workload the records belong to (anwar2021: default 'anwar2021'; csv: overrides the column); "
            "a job's workload is <distribution>:<dataset>, e.g. fc2-digits-cnn:digits",
        )
        parser.add_argument(
            "--owner",
            metavar="USERNAME",
            help="import them as this user's records, which only their answers read (default: the platform's, "
            "which every user's answers read)",
        )
        parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            owner = user_named(options["owner"])
            result = import_file(Path(options["path"]), options["format"], options["workload"], owner)
        except PerfDataError as exc:
            self.fail(str(exc), options["json"])
        summary = {
            "ok": True,
            "workloads": list(result.workloads),
            "imported": result.imported,
            "failed_runs": result.failed_runs,
            "replaced": result.replaced,
            "owner": result.owner or None,  # None: the platform's
        }
        whose = f"{result.owner}'s records" if result.owner else "the platform's (every user's answers read them)"
        if options["json"]:
            self.stdout.write(json.dumps(summary))
        else:
            self.stdout.write(
                f"imported {result.imported} records for {', '.join(result.workloads)} as {whose} "
                f"({result.failed_runs} failed runs kept; {result.replaced} from an earlier import replaced)"
            )
