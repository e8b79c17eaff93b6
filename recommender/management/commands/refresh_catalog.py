"""`manage.py refresh_catalog --region R [--name NAME] [--dry-run] [--write-file] [--json]`: rebuild a catalogue from
the live AWS Pricing API and EC2, save it (types AWS no longer lists are removed) and optionally rewrite its JSON file.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from django.core.management.base import CommandParser

from recommender import pricing
from recommender.catalog import save_catalog, write_catalog_file
from recommender.management.base import ContractCommand


class Command(ContractCommand):
    help = (
        "Rebuild an instance catalogue from the AWS Pricing API (on-demand Linux prices) and EC2 instance types; "
        "on failure print `error: <reason>` on stderr and exit 1."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--region", required=True, help="AWS region code, e.g. us-east-1")
        parser.add_argument("--name", help="catalogue name (default: aws-<region>)")
        parser.add_argument("--dry-run", action="store_true", help="fetch and build, but leave the database alone")
        parser.add_argument(
            "--write-file", action="store_true", help="also write recommender/catalogs/<name>.json (bundled file)"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = options["json"]
        try:
            data = pricing.fetch_catalog(options["region"], name=options["name"])
        except pricing.PricingError as exc:
            self.fail(str(exc), as_json)
        removed = None if options["dry_run"] else save_catalog(data)[1]
        path = write_catalog_file(data) if options["write_file"] else None
        families = Counter(pricing.family(row["name"]) for row in data["types"])
        summary = {
            "ok": True,
            "name": data["name"],
            "version": data["version"],
            "region": data["region"],
            "types": len(data["types"]),
            "families": dict(sorted(families.items())),
            "saved": removed is not None,
            "removed": removed or [],
            "file": str(path) if path else None,
        }
        if as_json:
            self.stdout.write(json.dumps(summary))
            return
        where = "saved" if removed is not None else "not saved (dry run)"
        self.stdout.write(f"catalogue {data['name']} ({data['version']}): {len(data['types'])} instance types, {where}")
        self.stdout.write("families: " + ", ".join(f"{name} {count}" for name, count in summary["families"].items()))
        if removed:
            self.stdout.write("removed (no longer listed): " + ", ".join(removed))
        if path:
            self.stdout.write(f"wrote {path}")
