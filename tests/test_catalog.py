"""Instance catalogues: the AWS price/spec parsing, `refresh_catalog` against stubbed AWS clients, its error paths,
and the bundled JSON catalogues.

AWS is patched at one place only — common.awsapi.client (the one boto3 adaptor), which hands out real boto3
clients wrapped in botocore's Stubber and fed the responses in tests/data/ (AWS's own response shapes: PriceList is
a list of JSON strings, and both answers come in two pages).
"""

from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from django.core.management import call_command

from common import awsapi
from recommender import catalog as catalog_module
from recommender import pricing
from recommender.catalog import bundled_catalogs, load_catalog, save_catalog
from recommender.models import Catalog, InstanceType

DATA = Path(__file__).resolve().parent / "data"
PRODUCT_PAGES = json.loads((DATA / "pricing_get_products_us-east-1.json").read_text())
TYPE_PAGES = json.loads((DATA / "ec2_describe_instance_types_us-east-1.json").read_text())

# What the recorded responses must turn into (m5.metal, the Graviton m7g and the zero-priced c6i are left out).
EXPECTED = {
    # name: (hourly_price, vcpu, memory_gib, gpus, gpu_model, network_mbps)
    "m5.large": (0.096, 2, 8, 0, "", 750),
    "c5n.xlarge": (0.216, 4, 10.5, 0, "", 5000),
    "g4dn.xlarge": (0.526, 4, 16, 1, "NVIDIA T4", 5000),
    "p4d.24xlarge": (21.957642, 96, 1152, 8, "NVIDIA A100", 400000),
    "r6i.large": (0.126, 2, 16, 0, "", 781),
    "g6e.xlarge": (1.861, 4, 32, 1, "NVIDIA L40S", 20000),  # no baseline in that answer: the "Up to" figure
}


@pytest.fixture(autouse=True)
def _fake_aws_credentials(monkeypatch, tmp_path):
    """Credentials that are clearly fake and no shared config, so nothing here can reach a real account."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def stubbed_aws(monkeypatch):
    """Real clients, stubbed with the recorded pages; yields the stubbers so a test can add errors instead."""
    clients = {
        "pricing": boto3.client("pricing", region_name=pricing.PRICING_REGION),
        "ec2": boto3.client("ec2", region_name="us-east-1"),
    }
    stubbers = {service: Stubber(client) for service, client in clients.items()}
    monkeypatch.setattr(awsapi, "client", lambda service, region: clients[service])
    for stubber in stubbers.values():
        stubber.activate()
    yield stubbers
    for stubber in stubbers.values():
        stubber.deactivate()


def add_recorded_pages(stubbers, region="us-east-1"):
    request = {
        "ServiceCode": "AmazonEC2",
        "Filters": pricing.product_filters(region),
        "FormatVersion": "aws_v1",
        "MaxResults": pricing.PAGE_SIZE,
    }
    for page in PRODUCT_PAGES:
        stubbers["pricing"].add_response("get_products", page, dict(request))
        request["NextToken"] = page.get("NextToken")
    request = {"Filters": pricing.type_filters()}
    for page in TYPE_PAGES:
        stubbers["ec2"].add_response("describe_instance_types", page, dict(request))
        request["NextToken"] = page.get("NextToken")


def refresh(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("refresh_catalog", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def refresh_fails(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("refresh_catalog", *args, stdout=out, stderr=err)
    assert exit_info.value.code == 1
    return out.getvalue(), err.getvalue()


# ---- parsing ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mbps"),
    [
        ("Up to 10 Gigabit", 10000),
        ("Up to 12.5 Gigabit", 12500),
        ("25 Gigabit", 25000),
        ("12 Gigabit", 12000),
        ("4x 100 Gigabit", 400000),
        ("8x 100 Gigabit", 800000),
        ("3200 Gigabit", 3200000),
        ("Up to 5 Gigabit", 5000),
        ("Very Low", 50),
        ("Low", 100),
        ("Low to Moderate", 300),
        ("Moderate", 450),
        ("High", 1000),
        ("", None),
        ("Variable", None),
    ],
)
def test_network_mbps(text, mbps):
    assert pricing.network_mbps(text) == mbps


@pytest.mark.parametrize(
    ("name", "wanted"),
    [("m5.large", True), ("c5n.18xlarge", True), ("p5.48xlarge", True), ("g4dn.metal", False),
     ("c7i.metal-24xl", False), ("m7g.large", False), ("t3.micro", False), ("m5a.large", False)],
)  # fmt: skip
def test_wanted_families(name, wanted):
    assert pricing.wanted(name) is wanted


def test_every_recorded_price_is_parsed_from_its_json_string():
    offers = {
        offer.instance_type: offer
        for page in PRODUCT_PAGES
        for item in page["PriceList"]
        if (offer := pricing.parse_offer(item))
    }
    # The reserved terms beside each on-demand one are not prices we charge by the hour; the zero price is dropped.
    assert offers["m5.large"].hourly_price == 0.096
    assert offers["p4d.24xlarge"].hourly_price == 21.957642
    assert "c6i.large" not in offers
    assert set(offers) == {"m5.large", "c5n.xlarge", "g4dn.xlarge", "p4d.24xlarge", "m5.metal", "m7g.large",
                           "r6i.large", "g6e.xlarge"}  # fmt: skip


def test_offers_that_are_not_on_demand_box_usage_are_skipped():
    item = json.loads(PRODUCT_PAGES[0]["PriceList"][0])
    item["product"]["attributes"]["usagetype"] = "DedicatedUsage:m5.large"
    assert pricing.parse_offer(json.dumps(item)) is None
    item["product"]["attributes"].update(usagetype="BoxUsage:m5.large", marketoption="CapacityBlock")
    assert pricing.parse_offer(json.dumps(item)) is None


def test_recorded_instance_types_are_parsed():
    specs = {spec.name: spec for page in TYPE_PAGES for spec in map(pricing.parse_type_info, page["InstanceTypes"])}
    p4d = specs["p4d.24xlarge"]
    assert (p4d.vcpu, p4d.memory_gib, p4d.gpus, p4d.gpu_model, p4d.network_mbps) == (96, 1152, 8, "NVIDIA A100", 400000)
    assert specs["c5n.xlarge"].memory_gib == 10.5
    assert specs["m5.large"].network_mbps == 750  # the baseline, not the 10 Gbit burst
    assert specs["g6e.xlarge"].network_mbps == 20000  # no baseline reported: the text's figure


def test_build_catalog_keeps_types_with_a_price_and_a_spec():
    offers = [pricing.Offer("m5.large", 0.096), pricing.Offer("g5.xlarge", 1.006)]
    specs = {"m5.large": pricing.TypeSpec("m5.large", 2, 8, network_mbps=750)}
    data = pricing.build_catalog("us-east-1", offers, specs, version="test")
    assert data["name"] == "aws-us-east-1" and data["version"] == "test" and data["region"] == "us-east-1"
    assert "refresh_catalog --region us-east-1" in data["source"]
    assert data["types"] == [
        {"name": "m5.large", "role": "any", "hourly_price": 0.096, "vcpu": 2, "memory_gib": 8, "gpus": 0,
         "network_mbps": 750}
    ]  # fmt: skip


# ---- the command against stubbed AWS -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_refresh_builds_and_saves_the_catalogue(stubbed_aws):
    add_recorded_pages(stubbed_aws)
    out, err = refresh("--region", "us-east-1", "--json")

    summary = json.loads(out)
    assert summary["ok"] and summary["saved"] and summary["name"] == "aws-us-east-1"
    assert summary["types"] == len(EXPECTED)
    assert summary["families"] == {"c5n": 1, "g4dn": 1, "g6e": 1, "m5": 1, "p4d": 1, "r6i": 1}
    assert err == ""
    for stubber in stubbed_aws.values():
        stubber.assert_no_pending_responses()  # both answers were read to their last page

    catalog = Catalog.objects.get(name="aws-us-east-1")
    assert (catalog.provider, catalog.region) == ("aws", "us-east-1")
    rows = {
        row.name: (row.hourly_price, row.vcpu, row.memory_gib, row.gpus, row.gpu_model, row.network_mbps)
        for row in catalog.types.all()
    }
    # hourly_price keeps the price list's 6 decimals (p4d: 21.957642).
    assert rows == {name: (Decimal(str(price)), *rest) for name, (price, *rest) in EXPECTED.items()}
    assert set(catalog.types.values_list("role", flat=True)) == {"any"}


@pytest.mark.django_db
def test_refresh_replaces_types_no_longer_listed(stubbed_aws):
    save_catalog({"name": "aws-us-east-1", "version": "old", "region": "us-east-1",
                  "types": [{"name": "m4.large", "hourly_price": 0.1, "network_mbps": 450},
                            {"name": "m5.large", "hourly_price": 0.5}]})  # fmt: skip
    add_recorded_pages(stubbed_aws)
    out, _ = refresh("--region", "us-east-1")

    assert "removed (no longer listed): m4.large" in out
    catalog = Catalog.objects.get(name="aws-us-east-1")
    assert catalog.version != "old"
    assert not catalog.types.filter(name="m4.large").exists()
    assert float(catalog.types.get(name="m5.large").hourly_price) == 0.096


@pytest.mark.django_db
def test_dry_run_writes_nothing_and_write_file_round_trips(stubbed_aws, monkeypatch, tmp_path):
    monkeypatch.setattr(catalog_module, "CATALOG_DIR", tmp_path)
    add_recorded_pages(stubbed_aws)
    summary = json.loads(
        refresh("--region", "us-east-1", "--name", "aws-test", "--dry-run", "--write-file", "--json")[0]
    )

    assert not summary["saved"] and summary["file"] == str(tmp_path / "aws-test.json")
    assert not Catalog.objects.exists()
    # The written file is a bundled catalogue like any other.
    catalog = load_catalog("aws-test")
    assert catalog.types.count() == len(EXPECTED)
    assert catalog.types.get(name="g4dn.xlarge").gpu_model == "NVIDIA T4"


# ---- error paths: `error: …` and exit 1, never a traceback --------------------------------------------------------


@pytest.mark.django_db
def test_missing_credentials(monkeypatch):
    # The real adaptor and credential chain, with nothing to find.
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    out, err = refresh_fails("--region", "us-east-1", "--json")
    assert err.startswith("error: ") and "no AWS credentials found" in err
    assert json.loads(out) == {"ok": False, "error": err.strip().removeprefix("error: ")}
    assert not Catalog.objects.exists()


@pytest.mark.django_db
def test_api_error(stubbed_aws):
    stubbed_aws["pricing"].add_client_error(
        "get_products",
        service_error_code="AccessDeniedException",
        service_message="User is not authorized to perform: pricing:GetProducts",
        http_status_code=400,
    )
    _, err = refresh_fails("--region", "us-east-1")
    assert err.strip() == (
        "error: cannot read prices for us-east-1 from the AWS Pricing API: AccessDeniedException: "
        "User is not authorized to perform: pricing:GetProducts"
    )


@pytest.mark.django_db
def test_ec2_error_after_prices(stubbed_aws):
    stubbed_aws["pricing"].add_response(
        "get_products", {"FormatVersion": "aws_v1", "PriceList": PRODUCT_PAGES[1]["PriceList"]}
    )
    stubbed_aws["ec2"].add_client_error("describe_instance_types", "UnauthorizedOperation", "You are not authorized")
    _, err = refresh_fails("--region", "us-east-1")
    assert err.startswith("error: cannot describe instance types in us-east-1: UnauthorizedOperation")


@pytest.mark.django_db
def test_unknown_region_lists_no_prices(stubbed_aws):
    stubbed_aws["pricing"].add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []})
    _, err = refresh_fails("--region", "mars-north-1")
    assert "lists no on-demand Linux prices for region 'mars-north-1'" in err


@pytest.mark.django_db
def test_unreachable_endpoint_honours_aws_endpoint_url(monkeypatch, unused_port):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{unused_port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    _, err = refresh_fails("--region", "us-east-1")
    assert err.startswith("error: cannot read prices for us-east-1") and f"127.0.0.1:{unused_port}" in err


@pytest.fixture
def unused_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- the bundled catalogues ---------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["aws-us-east-1", "aws-ap-southeast-1"])
def test_bundled_aws_catalogues_load(name):
    assert name in bundled_catalogs()
    catalog = load_catalog(name)
    types = list(catalog.types.all())
    assert len(types) >= 100
    assert catalog.version and "refresh_catalog --region" in catalog.source
    for row in types:
        assert row.hourly_price > 0, row.name
        assert row.vcpu and row.memory_gib and row.network_mbps, row.name
        assert row.role == InstanceType.Role.ANY
        assert pricing.wanted(row.name), f"{row.name} is outside pricing.FAMILIES: a refresh would drop it"
        if row.gpus:
            assert row.gpu_model.startswith("NVIDIA "), row.name
        else:
            assert row.gpu_model == "", row.name


def test_bundled_files_are_in_the_written_layout():
    # A catalogue rewritten by `refresh_catalog --write-file` diffs cleanly against the bundled one.
    for name in ("aws-us-east-1", "aws-ap-southeast-1"):
        text = catalog_module.catalog_path(name).read_text()
        assert catalog_module.dump_catalog(json.loads(text)) == text
