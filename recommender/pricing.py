"""Building an instance catalogue from AWS itself: on-demand prices from the Pricing API, capacities from EC2.

`fetch_catalog(region)` asks the Pricing API (`get_products`: AmazonEC2, Linux, shared tenancy, no pre-installed
software, capacity status Used) for the region's on-demand prices and EC2 `describe_instance_types` for vCPUs, memory,
GPUs and network capacity, keeps the families in FAMILIES, and returns the catalogue dict recommender.catalog saves.
The parsing functions below are pure (they take what AWS returns and give values) and the AWS calls are separate;
AWS is reached only through the platform's one boto3 adaptor (common/awsapi.py: its retries, credential chain and
AWS_ENDPOINT_URL), whose failures become PricingErrors here.

Spot prices (`fetch_spot_quotes`) come from EC2's spot price history of the region (`describe_spot_price_history`,
every page): each type's latest price in each zone, the cheapest zone's kept, raised by the share of time a spot
cluster is expected to lose to interruptions (SPOT_INTERRUPTION_OVERHEAD: the relaunch and the work since the last
checkpoint) and set beside the on-demand price as the expected saving.

Network capacity (B_ps when a type serves as PS) is the baseline bandwidth EC2 reports per network card, summed; a
type that reports none falls back to its NetworkPerformance text ("25 Gigabit" → 25000 Mbps, "Up to 10 Gigabit" →
the 10000 Mbps burst — an upper bound, not what the type sustains).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from common import awsapi

PRICING_REGION = "us-east-1"  # the Pricing API answers from us-east-1 for every region's prices
PAGE_SIZE = 100  # get_products' largest page

# Families an ML researcher would consider (x86 only: the TensorFlow wheels the platform installs are x86).
FAMILIES = (
    # general purpose
    "m5",
    "m6i",
    "m7i",
    "m6a",
    # compute optimised (c5n: network optimised, a natural PS)
    "c5",
    "c5n",
    "c6i",
    "c7i",
    "c6a",
    # memory optimised
    "r5",
    "r6i",
    # GPU
    "g4dn",
    "g5",
    "g6",
    "g6e",
    "p3",
    "p3dn",
    "p4d",
    "p5",
)

# What EC2 says for types without a Gigabit figure (older generations), in Mbps. "Moderate" and "High" are the
# capacities FC² §7 measured for m4.large (≈ 450 Mbps) and m4.2xlarge (≈ 1 Gbps); the lower grades are below those.
QUALITATIVE_MBPS = {"very low": 50.0, "low": 100.0, "low to moderate": 300.0, "moderate": 450.0, "high": 1000.0}

_BANDWIDTH = re.compile(r"^(?:up to\s+)?(?:(\d+)\s*x\s+)?(\d+(?:\.\d+)?)\s*(gigabit|megabit)", re.IGNORECASE)


class PricingError(Exception):
    """AWS could not be asked, or its answer cannot make a catalogue; the message says why, in a sentence."""


@dataclass(frozen=True)
class Offer:
    """One on-demand price from the Pricing API."""

    instance_type: str  # e.g. "m5.large"
    hourly_price: float  # USD per hour, Linux, shared tenancy
    ecu: float | None = None  # EC2 compute units where the price list gives a number


@dataclass(frozen=True)
class TypeSpec:
    """One instance type's capacities from EC2 DescribeInstanceTypes."""

    name: str  # e.g. "g4dn.xlarge"
    vcpu: int  # default vCPUs
    memory_gib: float
    gpus: int = 0
    gpu_model: str = ""  # "<manufacturer> <name>", e.g. "NVIDIA T4"
    network_mbps: float | None = None  # baseline where reported, else the NetworkPerformance figure


# ---- pure parsing -------------------------------------------------------------------------------------------------


def network_mbps(performance: str) -> float | None:
    """Mbps for an EC2 NetworkPerformance text; "Up to …" gives the burst figure, unknown text gives None.

    >>> network_mbps("Up to 12.5 Gigabit")
    12500.0
    >>> network_mbps("25 Gigabit")
    25000.0
    >>> network_mbps("4x 100 Gigabit")
    400000.0
    >>> network_mbps("3200 Gigabit")
    3200000.0
    >>> network_mbps("Moderate"), network_mbps("High"), network_mbps("Low to Moderate")
    (450.0, 1000.0, 300.0)
    >>> network_mbps("Up to 800 Megabit")
    800.0
    >>> network_mbps("Variable") is None
    True
    """
    text = " ".join(performance.split())
    match = _BANDWIDTH.match(text)
    if match:
        cards, value, unit = match.groups()
        mbps = float(value) * (int(cards) if cards else 1) * (1000 if unit.lower() == "gigabit" else 1)
        return round(mbps, 1)
    return QUALITATIVE_MBPS.get(text.lower())


def baseline_mbps(network_info: dict) -> float | None:
    """Sum of the network cards' baseline bandwidth (Mbps), or None when EC2 does not report it for every card.

    >>> baseline_mbps({"NetworkCards": [{"BaselineBandwidthInGbps": 0.781, "PeakBandwidthInGbps": 12.5}]})
    781.0
    >>> baseline_mbps({"NetworkCards": [{"BaselineBandwidthInGbps": 100.0}] * 4})
    400000.0
    >>> baseline_mbps({"NetworkPerformance": "Up to 10 Gigabit"}) is None
    True
    """
    cards = network_info.get("NetworkCards") or []
    if not cards or any(card.get("BaselineBandwidthInGbps") is None for card in cards):
        return None
    return round(sum(card["BaselineBandwidthInGbps"] for card in cards) * 1000, 1)


def family(instance_type: str) -> str:
    """The family part of an instance type's name.

    >>> family("g4dn.xlarge")
    'g4dn'
    """
    return instance_type.split(".", 1)[0]


def wanted(instance_type: str, families: Iterable[str] = FAMILIES) -> bool:
    """Whether a type belongs in the catalogue: its family is chosen and it is not bare metal (same capacity as the
    largest virtualised size, at the same price or more).

    >>> wanted("c5n.large"), wanted("c5n.metal"), wanted("m7g.large"), wanted("c5a.large")
    (True, False, False, False)
    """
    name, _, size = instance_type.partition(".")
    return name in families and not size.startswith("metal")


def parse_ecu(text: str | None) -> float | None:
    """EC2 compute units from the price list's `ecu` attribute, None where it gives none (newer types, burstables).

    >>> parse_ecu("6.5"), parse_ecu("Variable"), parse_ecu("NA"), parse_ecu(None)
    (6.5, None, None, None)
    """
    try:
        return float(text) if text else None
    except ValueError:
        return None


def parse_offer(price_item: str) -> Offer | None:
    """The on-demand offer in one PriceList entry (a JSON string), or None when it holds no usable price.

    Skipped: anything not an on-demand box-usage instance (capacity blocks, reservations, dedicated hosts), and
    prices of 0 (AWS lists some products it does not charge per hour for).

    >>> item = {"product": {"attributes": {"instanceType": "m5.large", "usagetype": "BoxUsage:m5.large",
    ...     "ecu": "NA"}}, "terms": {"OnDemand": {"T.JRTCKXETXF": {"priceDimensions": {"T.JRTCKXETXF.6YS6EN2CT7": {
    ...     "unit": "Hrs", "pricePerUnit": {"USD": "0.0960000000"}}}}}}}
    >>> parse_offer(json.dumps(item))
    Offer(instance_type='m5.large', hourly_price=0.096, ecu=None)
    """
    item = json.loads(price_item)
    attributes = item.get("product", {}).get("attributes", {})
    instance_type = attributes.get("instanceType")
    if not instance_type:
        return None
    if attributes.get("marketoption", "OnDemand") != "OnDemand" or "BoxUsage" not in attributes.get(
        "usagetype", "BoxUsage"
    ):
        return None
    prices = [
        float(dimension["pricePerUnit"]["USD"])
        for term in item.get("terms", {}).get("OnDemand", {}).values()
        for dimension in term.get("priceDimensions", {}).values()
        if dimension.get("unit", "Hrs") in ("Hrs", "Hours") and "USD" in dimension.get("pricePerUnit", {})
    ]
    prices = [price for price in prices if price > 0]
    if not prices:
        return None
    return Offer(instance_type, min(prices), parse_ecu(attributes.get("ecu")))


def gpu_summary(gpu_info: dict | None) -> tuple[int, str]:
    """(GPU count, "<manufacturer> <name>") from DescribeInstanceTypes' GpuInfo; (0, "") without GPUs.

    >>> gpu_summary({"Gpus": [{"Name": "T4", "Manufacturer": "NVIDIA", "Count": 1}]})
    (1, 'NVIDIA T4')
    >>> gpu_summary(None)
    (0, '')
    """
    gpus = (gpu_info or {}).get("Gpus") or []
    count = sum(gpu.get("Count", 0) for gpu in gpus)
    models = sorted({" ".join(filter(None, (gpu.get("Manufacturer"), gpu.get("Name")))) for gpu in gpus})
    return count, " + ".join(models)


def parse_type_info(info: dict) -> TypeSpec:
    """A TypeSpec from one InstanceTypes entry of DescribeInstanceTypes."""
    gpus, gpu_model = gpu_summary(info.get("GpuInfo"))
    network = info.get("NetworkInfo", {})
    mbps = baseline_mbps(network)
    if mbps is None:
        mbps = network_mbps(network.get("NetworkPerformance", ""))
    return TypeSpec(
        name=info["InstanceType"],
        vcpu=info["VCpuInfo"]["DefaultVCpus"],
        memory_gib=_plain(info["MemoryInfo"]["SizeInMiB"] / 1024),
        gpus=gpus,
        gpu_model=gpu_model,
        network_mbps=None if mbps is None else _plain(mbps),
    )


def build_catalog(region: str, offers: Iterable[Offer], specs: dict[str, TypeSpec], **fields: str) -> dict:
    """The catalogue dict (recommender.catalog's shape) for the types that have both a price and a spec.

    `fields` override name (default aws-<region>), version (default today, UTC) and source.
    """
    today = datetime.now(UTC).date().isoformat()
    types = []
    for offer in sorted(offers, key=lambda o: (family(o.instance_type), o.hourly_price, o.instance_type)):
        spec = specs.get(offer.instance_type)
        if spec is None:
            continue
        row = {"name": spec.name, "role": "any", "hourly_price": offer.hourly_price, "vcpu": spec.vcpu}
        if offer.ecu is not None:
            row["ecu"] = offer.ecu
        row.update(memory_gib=spec.memory_gib, gpus=spec.gpus)
        if spec.gpus:
            row["gpu_model"] = spec.gpu_model
        row["network_mbps"] = spec.network_mbps
        types.append(row)
    return {
        "name": fields.get("name") or f"aws-{region}",
        "version": fields.get("version") or today,
        "provider": "aws",
        "region": region,
        "source": fields.get("source")
        or (
            f"AWS Price List API (AmazonEC2 on-demand, Linux, shared tenancy, no pre-installed software) and EC2 "
            f"DescribeInstanceTypes in {region}, fetched {today}; network_mbps is the baseline bandwidth EC2 reports, "
            f"else its NetworkPerformance figure. Rebuild with `manage.py refresh_catalog --region {region}`."
        ),
        "types": types,
    }


def product_filters(region: str) -> list[dict]:
    """get_products filters for a region's on-demand Linux prices on shared hardware."""
    wanted_terms = {
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    return [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in wanted_terms.items()]


def type_filters(families: Iterable[str] = FAMILIES) -> list[dict]:
    """describe_instance_types filters: one wildcard per family."""
    return [{"Name": "instance-type", "Values": [f"{name}.*" for name in families]}]


def _plain(number: float) -> float | int:
    """Whole numbers as ints, so the JSON files read 16, not 16.0."""
    return int(number) if float(number).is_integer() else round(number, 3)


# The share of a spot instance's time expected lost to interruptions — a lost node's relaunch and restart, and the
# work since the last checkpoint (managed jobs, fc2/services/pipeline.py: node_lost) — by which its expected price is
# raised before it is set beside the on-demand price. Spot's own interruption frequencies are mostly under 10 %.
SPOT_INTERRUPTION_OVERHEAD = 0.10
# How far back the spot price history is read: each zone's latest price is within it.
SPOT_HISTORY = timedelta(days=1)


@dataclass(frozen=True)
class SpotQuote:
    """A type's spot price in a region beside its on-demand price."""

    instance_type: str
    spot_price: float  # $/h: the latest price of the region's cheapest zone for it
    zone: str  # that zone
    on_demand: float | None  # $/h, from the catalogue; None where it has no price for the type

    @property
    def expected(self) -> float:
        """$/h expected, the interruptions' overhead included."""
        return self.spot_price * (1 + SPOT_INTERRUPTION_OVERHEAD)

    @property
    def saving(self) -> float | None:
        """The expected saving beside on-demand, as a share of its price (negative: spot costs more)."""
        return 1 - self.expected / self.on_demand if self.on_demand else None

    def describe(self) -> str:
        saving = f": expected saving {self.saving:.0%}" if self.saving is not None else ""
        on_demand = f" vs ${self.on_demand:.4f}/h on-demand" if self.on_demand else ""
        return (
            f"{self.instance_type} spot ${self.spot_price:.4f}/h in {self.zone}, expected ${self.expected:.4f}/h with "
            f"{SPOT_INTERRUPTION_OVERHEAD:.0%} for interruptions{on_demand}{saving}"
        )


def latest_spot_prices(history: Iterable[dict]) -> dict[str, tuple[float, str]]:
    """Instance type -> (price, zone): of each zone's latest entry in `history` (describe_spot_price_history's
    SpotPriceHistory), the cheapest."""
    latest: dict[tuple[str, str], tuple[str, float]] = {}
    for entry in history:
        key = (entry["InstanceType"], entry["AvailabilityZone"])
        stamp = str(entry.get("Timestamp", ""))
        if key not in latest or stamp > latest[key][0]:
            latest[key] = (stamp, float(entry["SpotPrice"]))
    cheapest: dict[str, tuple[float, str]] = {}
    for (instance_type, zone), (_, price) in sorted(latest.items()):
        if instance_type not in cheapest or price < cheapest[instance_type][0]:
            cheapest[instance_type] = (price, zone)
    return cheapest


def fetch_spot_quotes(region: str, on_demand: dict[str, float | None]) -> list[SpotQuote]:
    """The spot quotes of the types in `on_demand` (type -> its on-demand $/h) in `region`, from EC2's spot price
    history (Linux, every page); a type with no spot price there has none."""
    with aws_errors(f"cannot read the spot price history of {region}"):
        history = awsapi.pages(
            "ec2",
            region,
            "describe_spot_price_history",
            "SpotPriceHistory",
            InstanceTypes=sorted(on_demand),
            ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            StartTime=datetime.now(UTC) - SPOT_HISTORY,
        )
    prices = latest_spot_prices(history)
    return [SpotQuote(t, *prices[t], on_demand[t]) for t in sorted(on_demand) if t in prices]


# ---- AWS calls ----------------------------------------------------------------------------------------------------


@contextmanager
def aws_errors(what: str) -> Iterator[None]:
    """Turn the adaptor's failures into a PricingError saying what could not be done and why."""
    try:
        yield
    except awsapi.AwsError as error:
        if error.credentials:
            raise PricingError(
                f"{what}: no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
            ) from None
        raise PricingError(
            f"{what}: {error.code}: {error.detail}" if error.code else f"{what}: {error.detail}"
        ) from None


def fetch_offers(region: str) -> list[Offer]:
    """The region's on-demand offers for the chosen families, from the Pricing API (every page)."""
    with aws_errors(f"cannot read prices for {region} from the AWS Pricing API"):
        items = awsapi.pages(
            "pricing",
            PRICING_REGION,
            "get_products",
            "PriceList",
            ServiceCode="AmazonEC2",
            Filters=product_filters(region),
            FormatVersion="aws_v1",
            MaxResults=PAGE_SIZE,
        )
        offers = [offer for item in items if (offer := parse_offer(item))]
    return [offer for offer in offers if wanted(offer.instance_type)]


def fetch_specs(region: str) -> dict[str, TypeSpec]:
    """Capacities of the chosen families' types offered in the region, from EC2 (every page)."""
    with aws_errors(f"cannot describe instance types in {region}"):
        infos = awsapi.pages("ec2", region, "describe_instance_types", "InstanceTypes", Filters=type_filters())
    return {spec.name: spec for spec in map(parse_type_info, infos) if wanted(spec.name)}


def fetch_catalog(region: str, **fields: str) -> dict:
    """The catalogue of `region` as AWS publishes it now (PricingError when AWS cannot be asked or lists nothing)."""
    offers = fetch_offers(region)
    if not offers:
        raise PricingError(f"the AWS Pricing API lists no on-demand Linux prices for region {region!r}")
    catalog = build_catalog(region, offers, fetch_specs(region), **fields)
    if not catalog["types"]:
        raise PricingError(f"EC2 in {region} describes none of the {len(offers)} priced instance types")
    return catalog
