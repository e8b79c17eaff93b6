"""`manage.py load_catalog FILE.json`: an operator's own price list loads in the bundled catalogues' format; a bad
file is refused with its reason, exit 1, and changes nothing (one transaction, checked whole first)."""

from __future__ import annotations

import json
from contextlib import nullcontext
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command

from recommender.catalog import load_catalog
from recommender.models import Catalog, InstanceType

GOOD = {
    "name": "lab",
    "version": "ops-1",
    "provider": "lab",
    "region": "",
    "source": "our own price list",
    "types": [
        {"name": "lab-ps-1g", "role": "ps", "hourly_price": 0.4, "vcpu": 1, "memory_gib": 2, "network_mbps": 1000},
        {"name": "lab-w-1g", "role": "worker", "hourly_price": 0.3, "vcpu": 2, "memory_gib": 2, "network_mbps": 1000},
    ],
}


def run(path, *args):
    out = StringIO()
    with pytest.raises(SystemExit) if "expect_exit" in args else nullcontext():
        call_command("load_catalog", str(path), *[a for a in args if a != "expect_exit"], stdout=out, stderr=StringIO())
    return out.getvalue()


def snapshot() -> list[tuple]:
    return sorted(InstanceType.objects.values_list("catalog__name", "catalog__version", "name", "hourly_price"))


@pytest.mark.django_db
def test_a_good_file_updates_the_catalogue_and_removes_types_it_no_longer_lists(tmp_path):
    load_catalog("lab")
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(GOOD))
    result = json.loads(run(path, "--json"))
    assert result == {"ok": True, "name": "lab", "version": "ops-1", "types": 2,
                      "removed": ["lab-ps-450", "lab-w-100", "lab-w-250"]}  # fmt: skip
    assert Catalog.objects.get(name="lab").version == "ops-1"
    assert InstanceType.objects.get(catalog__name="lab", name="lab-w-1g").hourly_price == Decimal("0.3")
    assert sorted(InstanceType.objects.filter(catalog__name="lab").values_list("name", flat=True)) == [
        "lab-ps-1g", "lab-w-1g"
    ]  # fmt: skip


def _bad(change):
    data = json.loads(json.dumps(GOOD))
    change(data)
    return data


BAD = [
    ("not JSON", "{", "is not JSON"),
    ("no types", _bad(lambda d: d.update(types=[])), '"types" must be a non-empty list'),
    ("no name", _bad(lambda d: d.pop("name")), 'non-empty "name"'),
    ("negative price", _bad(lambda d: d["types"][1].update(hourly_price=-1)), "types[1] (lab-w-1g): hourly_price"),
    ("price as text", _bad(lambda d: d["types"][1].update(hourly_price="0.3")), "hourly_price must be a number"),
    ("unknown field", _bad(lambda d: d["types"][0].update(colour="red")), "unknown field(s) colour"),
    ("bad role", _bad(lambda d: d["types"][0].update(role="boss")), "role must be one of"),
    ("twice", _bad(lambda d: d["types"].append(dict(d["types"][0]))), "listed twice"),
    ("long name", _bad(lambda d: d["types"][1].update(name="x" * 41)), "longer than 40"),
    ("zero network", _bad(lambda d: d["types"][1].update(network_mbps=0)), "network_mbps must be a positive"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("label", "content", "reason"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_file_is_refused_and_changes_nothing(tmp_path, label, content, reason):
    load_catalog("lab")
    before = snapshot()
    path = tmp_path / "lab.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    result = json.loads(run(path, "--json", "expect_exit"))
    assert result["ok"] is False and reason in result["error"]
    assert snapshot() == before


@pytest.mark.django_db
def test_a_missing_file_is_refused(tmp_path):
    result = json.loads(run(tmp_path / "nope.json", "--json", "expect_exit"))
    assert result["ok"] is False and "cannot read" in result["error"]
