"""Recommend latency on a ≥ 100-type catalogue against trivial JSON views, measured in one run (goal: ≤ 2×).

Everything goes through the whole Django stack (test client: middleware, session, view, JSON) in the same process.
Two trivial baselines: /api/me (a DRF view behind the same authentication as /api/recommend, returning two fields:
the ratio to it is what the recommender itself adds) and /healthz (a plain Django view, one `SELECT 1`, no auth).
Each algorithm is timed on the largest bundled catalogue; `scala-opt`, `lookup` and `model` use a workload of 222
generated records (any such records exercise the code; model quality is benchmarks/model_calibration.py's business).

    .venv/bin/python benchmarks/recommend_latency.py [--requests 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from benchmarks._django import setup_django  # noqa: E402


def timed(client, url: str, params: dict, n: int) -> float:
    """Median seconds per request."""
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        response = client.get(url, params)
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200, response.content[:300]
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()

    setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from recommender.catalog import bundled_catalogs, load_catalog
    from recommender.models import PerformanceRecord

    call_command("migrate", verbosity=0)
    catalogs = {name: load_catalog(name) for name in bundled_catalogs()}
    name, catalog = max(catalogs.items(), key=lambda item: item[1].types.count())
    types = list(catalog.types.filter(gpus=0).order_by("hourly_price").values_list("name", flat=True)[:6])
    PerformanceRecord.objects.bulk_create(
        PerformanceRecord(
            workload="bench", instance_type=t, workers=n, batch_size=b, latency_ms=lat, strategy="mirrored",
            epoch_time_s=round(50 / (n * (i + 1)) + 0.002 * b / 64 + lat * (n - 1) / 40, 3),
        )
        for i, t in enumerate(types) for n in (1, 2, 4, 8) for b in (64, 256, 1024) for lat in (0, 20, 60)
    )  # fmt: skip
    PerformanceRecord.objects.bulk_create(
        PerformanceRecord(workload="bench", instance_type=t, batch_size=256, bandwidth_mbps=80 + 10 * i)
        for i, t in enumerate(types)
    )
    user = get_user_model().objects.create_user("bench", password="bench-password-1")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)

    common = {"catalog": name, "worker_types": ",".join(types)}
    cases = {
        "cost-opt": {**common, "algorithm": "cost-opt", "budget": 5},
        "time-opt": {**common, "algorithm": "time-opt", "budget": 5},
        "scala-opt": {**common, "algorithm": "scala-opt", "budget": 5, "workload": "bench", "batch_size": 256},
        "lookup": {**common, "algorithm": "lookup", "workload": "bench", "batch_size": 256, "latency_ms": 20},
        "model": {
            **common,
            "algorithm": "model",
            "workload": "bench",
            "budget": 5,
            "batch_size": 256,
            "latency_ms": 20,
        },
        "cost-opt (all types)": {"catalog": name, "algorithm": "cost-opt", "budget": 5},
    }
    print(f"catalogue {name}: {catalog.types.count()} types; {PerformanceRecord.objects.count()} records; "
          f"median of {args.requests} requests each")  # fmt: skip
    healthz = timed(client, "/healthz", {}, args.requests)
    baseline = timed(client, "/api/me", {}, args.requests)
    print(f"{'':<30} {'median':>9} {'÷ /api/me':>10} {'÷ /healthz':>11}")
    print(f"{'/healthz (plain Django view)':<30} {healthz * 1000:6.2f} ms {healthz / baseline:9.2f}× {1:10.2f}×")
    print(f"{'/api/me (trivial DRF view)':<30} {baseline * 1000:6.2f} ms {1:9.2f}× {baseline / healthz:10.2f}×")
    for label, params in cases.items():
        seconds = timed(client, "/api/recommend", params, args.requests if label != "model" else args.requests // 4)
        print(
            f"{'recommend ' + label:<30} {seconds * 1000:6.2f} ms {seconds / baseline:9.2f}× {seconds / healthz:10.2f}×"
        )


if __name__ == "__main__":
    main()
