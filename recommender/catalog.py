"""Instance catalogues as data: the bundled JSON files (recommender/catalogs/*.json) and their rows in the database.

A catalogue is one dict — `name`, `version`, `provider`, `region`, `source` and `types` (one dict per instance type
with the InstanceType field names) — whether it comes from a bundled file or from the AWS Pricing API
(recommender.pricing); `save_catalog` is the one place that writes it to the database.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.db import transaction

from recommender.models import Catalog, InstanceType

CATALOG_DIR = Path(__file__).resolve().parent / "catalogs"
CATALOG_FIELDS = ("version", "provider", "region", "source")


def bundled_catalogs() -> list[str]:
    return sorted(path.stem for path in CATALOG_DIR.glob("*.json"))


def catalog_path(name: str) -> Path:
    return CATALOG_DIR / f"{name}.json"


def load_catalog(name: str) -> Catalog:
    """Create or update catalogue `name` from its JSON file; types no longer listed are removed."""
    path = catalog_path(name)
    if not path.exists():
        raise ValueError(f"no bundled catalogue {name!r} (available: {', '.join(bundled_catalogs())})")
    catalog, _ = save_catalog(json.loads(path.read_text()))
    return catalog


@transaction.atomic
def save_catalog(data: dict) -> tuple[Catalog, list[str]]:
    """Create or update the catalogue `data` describes; returns it and the names of the types it no longer lists."""
    catalog, _ = Catalog.objects.update_or_create(
        name=data["name"], defaults={k: data.get(k, "") for k in CATALOG_FIELDS}
    )
    names = []
    for row in data["types"]:
        fields = {k: v for k, v in row.items() if k != "name"}
        fields["gpu_model"] = fields.get("gpu_model") or ""
        InstanceType.objects.update_or_create(catalog=catalog, name=row["name"], defaults=fields)
        names.append(row["name"])
    stale = catalog.types.exclude(name__in=names)
    removed = sorted(stale.values_list("name", flat=True))
    stale.delete()
    return catalog, removed


def dump_catalog(data: dict) -> str:
    """The bundled-file layout: catalogue fields first, then one instance type per line (diffs stay readable)."""
    head = {"name": data["name"], **{k: data.get(k, "") for k in CATALOG_FIELDS}}
    lines = [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]
    rows = ",\n".join(f"    {json.dumps(row, ensure_ascii=False)}" for row in data["types"])
    return "{\n" + "\n".join(lines) + '\n  "types": [\n' + rows + "\n  ]\n}\n"


def write_catalog_file(data: dict) -> Path:
    path = catalog_path(data["name"])
    path.write_text(dump_catalog(data))
    return path
