"""`manage.py promote_records (--owner USERNAME | --id N …) [--workload NAME] [--dry-run] [--json]`: make users'
performance records the platform's, which every user's answers then read — an admin's judgement that they are sound
(the admin's "Promote" action does the same). Records no answer may read (a figure out of its bound) stay as they
are, counted."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from recommender import service
from recommender.management.base import ContractCommand, user_named
from recommender.models import PerformanceRecord


class Command(ContractCommand):
    help = "Make users' performance records the platform's, which every user's answers then read."
    requires_system_checks = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--owner", metavar="USERNAME", help="the records of this user")
        parser.add_argument("--id", type=int, nargs="+", default=[], metavar="N", help="the records of these ids")
        parser.add_argument("--workload", metavar="NAME", help="only this workload's")
        parser.add_argument("--dry-run", action="store_true", help="say what would be promoted, promote nothing")
        parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["owner"] and not options["id"]:  # (never every user's records at once by accident)
            self.fail("name the records to promote: --owner USERNAME or --id N …", options["json"])
        records = PerformanceRecord.objects.filter(owner__isnull=False)
        if options["owner"]:
            records = records.filter(owner=user_named(options["owner"]))
        if options["id"]:
            records = records.filter(pk__in=options["id"])
        if options["workload"]:
            records = records.filter(workload=options["workload"])
        if options["dry_run"]:
            promoted, left = records.usable().count(), records.exclude(pk__in=records.usable()).count()
        else:
            promoted, left = service.promote(records)
        summary = {"ok": True, "promoted": promoted, "left": left, "dry_run": options["dry_run"]}
        if options["json"]:
            self.stdout.write(json.dumps(summary))
            return
        verb = "would promote" if options["dry_run"] else "promoted"
        self.stdout.write(
            f"{verb} {promoted} records to the platform's"
            + (f"; {left} left as they were (a figure out of its bound, or marked unusable)" if left else "")
        )
