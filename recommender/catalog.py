"""Instance catalogues as data: the bundled JSON files (recommender/catalogs/*.json) and their rows in the database.

A catalogue is one dict — `name`, `version`, `provider`, `region`, `source` and `types` (one dict per instance type
with the InstanceType field names) — whether it comes from a bundled file or from the AWS Pricing API
(recommender.pricing); `save_catalog` is the one place that writes it to the database.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.db import transaction

from common.columns import max_length
from recommender.models import Catalog, InstanceType

CATALOG_DIR = Path(__file__).resolve().parent / "catalogs"
CATALOG_FIELDS = ("version", "provider", "region", "source")


def bundled_catalogs() -> list[str]:
    return sorted(path.stem for path in CATALOG_DIR.glob("*.json"))


def catalog_path(name: str) -> Path:
    return CATALOG_DIR / f"{name}.json"


class CatalogError(ValueError):
    """A catalogue file that cannot be loaded; the message says where and why."""


TYPE_FIELDS = {"name", "role", "hourly_price", "vcpu", "ecu", "memory_gib", "gpus", "gpu_model", "network_mbps"}
ROLES = {"ps", "worker", "any"}


def read_catalog_file(path: Path) -> dict:
    """The catalogue a JSON file in the bundled files' format holds, checked whole before anything is saved: a
    CatalogError names the first problem (the one rule for bundled files and an operator's own price list)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CatalogError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"].strip():
        raise CatalogError(f'{path}: a catalogue is a JSON object with a non-empty "name"')
    if not isinstance(data.get("types"), list) or not data["types"]:
        raise CatalogError(f'{path}: "types" must be a non-empty list of instance types')
    seen = set()
    for i, row in enumerate(data["types"]):
        where = f"{path}: types[{i}]"
        if not isinstance(row, dict) or not isinstance(row.get("name"), str) or not row["name"].strip():
            raise CatalogError(f'{where} must be an object with a non-empty "name"')
        where += f" ({row['name']})"
        if len(row["name"]) > max_length(InstanceType, "name"):
            raise CatalogError(f"{where}: name is longer than {max_length(InstanceType, 'name')} characters")
        if unknown := sorted(set(row) - TYPE_FIELDS):
            raise CatalogError(
                f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(TYPE_FIELDS))})"
            )
        if row["name"] in seen:
            raise CatalogError(f"{where}: listed twice")
        seen.add(row["name"])
        price = row.get("hourly_price")
        if isinstance(price, bool) or not isinstance(price, int | float) or not 0 <= price < 1e6:
            raise CatalogError(f"{where}: hourly_price must be a number of dollars from 0 to 1e6, got {price!r}")
        if row.get("role", "any") not in ROLES:
            raise CatalogError(f"{where}: role must be one of {', '.join(sorted(ROLES))}, got {row['role']!r}")
        for key in ("vcpu", "gpus"):
            if row.get(key) is not None and (
                isinstance(row[key], bool) or not isinstance(row[key], int) or row[key] < 0
            ):
                raise CatalogError(f"{where}: {key} must be a whole number ≥ 0, got {row[key]!r}")
        for key in ("ecu", "memory_gib", "network_mbps"):
            value = row.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                raise CatalogError(f"{where}: {key} must be a positive number or null, got {value!r}")
    return data


def load_catalog(name: str) -> Catalog:
    """Create or update catalogue `name` from its JSON file; types no longer listed are removed."""
    path = catalog_path(name)
    if not path.exists():
        raise ValueError(f"no bundled catalogue {name!r} (available: {', '.join(bundled_catalogs())})")
    catalog, _ = save_catalog(read_catalog_file(path))
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
