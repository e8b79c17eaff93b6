"""`manage.py load_catalog FILE.json [--json]`: load an operator's own price list, in the bundled catalogues' format
(recommender/catalogs/*.json), into the database — created, or updated with types it no longer lists removed.

The file is checked whole first (recommender.catalog.read_catalog_file, the rule the bundled files follow) and saved
in one transaction: a bad file prints `error: <reason>`, exits 1 and changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import CommandParser

from recommender.catalog import CatalogError, read_catalog_file, save_catalog
from recommender.management.base import ContractCommand


class Command(ContractCommand):
    help = (
        "Load an instance catalogue (price list) from a JSON file in the bundled catalogues' format; "
        "on failure print `error: <reason>` on stderr, exit 1 and change nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="the catalogue's JSON file")
        parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = options["json"]
        try:
            data = read_catalog_file(Path(options["file"]))
        except CatalogError as exc:
            self.fail(str(exc), as_json)
        catalog, removed = save_catalog(data)
        summary = {"ok": True, "name": catalog.name, "version": catalog.version, "types": len(data["types"]),
                   "removed": removed}  # fmt: skip
        if as_json:
            self.stdout.write(json.dumps(summary))
            return
        self.stdout.write(f"catalogue {catalog.name} ({catalog.version or 'no version'}): {len(data['types'])} types")
        if removed:
            self.stdout.write("removed (no longer listed): " + ", ".join(removed))
