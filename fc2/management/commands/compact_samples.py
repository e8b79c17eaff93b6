"""`manage.py compact_samples [--days N] [--dry-run] [--json]`: compact to one per node and minute the resource samples
of jobs that ended more than N days ago (default FC2_SAMPLE_FULL_DAYS, 7), as the daily periodic task does
(fc2/services/monitoring.py, monitor/retention.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import CommandParser

from fc2.services import monitoring
from monitor import retention
from recommender.management.base import ContractCommand


class Command(ContractCommand):
    help = (
        "Compact the node samples of jobs that ended more than N days ago to one per node and minute (readings "
        "averaged, byte counters and times of the minute's last sample)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days",
            type=int,
            default=None,
            metavar="N",
            help=f"jobs that ended more than N days ago (default: FC2_SAMPLE_FULL_DAYS, now {retention.full_days()})",
        )
        parser.add_argument("--dry-run", action="store_true", help="count what would be compacted; change nothing")
        parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = monitoring.compact_ended_jobs(options["days"], dry_run=options["dry_run"])
        except ValueError as exc:
            self.fail(str(exc), options["json"])
        if options["json"]:
            self.stdout.write(json.dumps({"ok": True, **asdict(result)}))
            return
        if not result.nodes:
            self.stdout.write(
                f"nothing to compact: the nodes of jobs that ended more than {result.days} days ago have one sample "
                "a minute at most"
            )
            return
        verb = "would compact (dry run)" if result.dry_run else "compacted"
        self.stdout.write(
            f"{verb} {_count(result.nodes, 'node')} of {_count(result.jobs, 'job')} that ended more than "
            f"{result.days} days ago: {result.rows_before:,} samples → {result.rows_after:,}"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
