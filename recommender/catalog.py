"""Loading the bundled instance catalogues (recommender/catalogs/*.json) into the database."""

from __future__ import annotations

import json
from pathlib import Path

from django.db import transaction

from recommender.models import Catalog, InstanceType

CATALOG_DIR = Path(__file__).resolve().parent / "catalogs"


def bundled_catalogs() -> list[str]:
    return sorted(path.stem for path in CATALOG_DIR.glob("*.json"))


@transaction.atomic
def load_catalog(name: str) -> Catalog:
    """Create or update catalogue `name` from its JSON file; types no longer listed are removed."""
    path = CATALOG_DIR / f"{name}.json"
    if not path.exists():
        raise ValueError(f"no bundled catalogue {name!r} (available: {', '.join(bundled_catalogs())})")
    data = json.loads(path.read_text())
    catalog, _ = Catalog.objects.update_or_create(
        name=data["name"],
        defaults={k: data.get(k, "") for k in ("version", "provider", "region", "source")},
    )
    names = []
    for row in data["types"]:
        fields = {k: v for k, v in row.items() if k != "name"}
        fields["gpu_model"] = fields.get("gpu_model") or ""
        InstanceType.objects.update_or_create(catalog=catalog, name=row["name"], defaults=fields)
        names.append(row["name"])
    catalog.types.exclude(name__in=names).delete()
    return catalog
