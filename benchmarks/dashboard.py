"""Admin dashboard speed at 10,000 jobs: server time and query count of /dashboard/, with and without filters.

Seeds the jobs (several users, every state, spread over weeks, with costs, failure reasons and running clusters) in a
scratch database, then requests the page through the whole Django stack (test client, logged in as staff) and prints
the median time over N requests, the number of SQL queries and the slowest one, for each query string.

SQLite in a scratch FC2_VAR_DIR by default. With DATABASE_URL set (PostgreSQL), the jobs go to a scratch database
beside the named one (`<name>_dashbench_<pid>`, created and dropped here); the named database is never touched.

    .venv/bin/python benchmarks/dashboard.py [--jobs 10000] [--users 40] [--weeks 12] [--requests 20]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from benchmarks._django import setup_django  # noqa: E402

# (state, weight, whether it started, whether it ended, whether its cluster is up)
STATES = [
    ("succeeded", 70, True, True, False),
    ("failed", 14, True, True, False),
    ("cancelled", 6, True, True, False),
    ("running", 5, True, False, True),
    ("bootstrapping", 1, False, False, True),
    ("collecting", 1, True, False, True),
    ("provisioning", 1, False, False, False),
    ("queued", 2, False, False, False),
]
PS_TYPES = {"m4.large": Decimal("0.125"), "m4.2xlarge": Decimal("0.5"), "m4.10xlarge": Decimal("2.5")}
WORKER_TYPES = {
    "m4.xlarge": Decimal("0.25"),
    "c4.xlarge": Decimal("0.231"),
    "c4.8xlarge": Decimal("1.848"),
    "p2.xlarge": Decimal("1.718"),
}
PROVIDERS = [("aws", 6), ("local", 3), ("lab", 1)]
FAILURES = [
    "worker-{n} exited with 137 (OOM killed)",
    "ps-0 unreachable after 120 s: connection refused",
    "InsufficientInstanceCapacity: no {t} capacity in ap-southeast-1a",
    "bundle import failed: ModuleNotFoundError: No module named 'torch'",
    "dataset fetch failed: HTTP 404 for https://data.example.org/set-{n}.csv",
    "budget exceeded: ${n}.00 spent of the run's limit",
    "job timed out after 6 h",
]


def seed(jobs: int, users: int, weeks: int, rng: random.Random):
    """The rows; returns the staff user to log in as."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from fc2.models import CodeBundle, Dataset, Job

    user_model = get_user_model()
    user_model.objects.bulk_create(user_model(username=f"user{i:02d}", password="!") for i in range(users))
    owners = list(user_model.objects.all())
    staff = user_model.objects.create_user("bench-admin", password="bench-password-1", is_staff=True)
    bundle = CodeBundle.objects.create(
        owner=owners[0],
        wheel="bundles/bench/demo-1.0-py3-none-any.whl",
        filename="demo-1.0-py3-none-any.whl",
        distribution="demo",
        version="1.0",
        main_script="demo/train.py",
        size_bytes=1,
        sha256="0" * 64,
    )
    dataset = Dataset.objects.create(name="digits", kind=Dataset.Kind.URL, url="https://example.com/d.csv", path="x")

    now = timezone.now()
    span_s = weeks * 7 * 86400
    names, weights = zip(*[(s[0], s[1]) for s in STATES], strict=True)
    facts = {s[0]: s[2:] for s in STATES}
    rows = []
    for n in range(jobs):
        state = rng.choices(names, weights)[0]
        started, ended, cluster_up = facts[state]
        ps_type, worker_type = rng.choice(list(PS_TYPES)), rng.choice(list(WORKER_TYPES))
        workers = rng.choice([1, 2, 2, 4, 4, 8, 16])
        if started and not ended:  # still going: submitted within the last day
            created = now - timedelta(seconds=rng.uniform(600, 86400))
        else:
            created = now - timedelta(seconds=rng.uniform(600, span_s))
        start = created + timedelta(seconds=rng.uniform(30, 600)) if started else None
        finish = start + timedelta(hours=rng.lognormvariate(0, 1.1)) if ended else None
        reason = rng.choice(FAILURES).format(n=rng.randint(0, 15), t=worker_type) if state == "failed" else ""
        nodes = [{"name": f"worker-{i}", "role": "worker", "address": f"10.0.0.{i + 2}"} for i in range(workers)]
        rows.append(
            Job(
                owner=rng.choice(owners),
                bundle=bundle,
                dataset=dataset,
                parameters={"epochs": "5"},
                provider=rng.choices([p for p, _ in PROVIDERS], [w for _, w in PROVIDERS])[0],
                strategy="ps",
                ps_type=ps_type,
                worker_type=worker_type,
                workers=workers,
                hourly_cost=PS_TYPES[ps_type] + workers * WORKER_TYPES[worker_type],
                state=state,
                failure_reason=reason,
                cluster={"cluster_id": f"bench-{n}", "nodes": nodes} if cluster_up else None,
                metrics={"accuracy": round(rng.uniform(0.8, 0.99), 4)} if state == "succeeded" else {},
                created_at=created,
                started_at=start,
                finished_at=finish,
            )
        )
    Job.objects.bulk_create(rows, batch_size=1000)
    return staff


def measure(client, params: dict, requests: int) -> tuple[float, int, float]:
    """(median seconds per request, queries per request, slowest query in seconds)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    samples = []
    for _ in range(requests):
        start = time.perf_counter()
        response = client.get("/dashboard/", params)
        samples.append(time.perf_counter() - start)
        assert response.status_code == 200, response.content[:300]
    with CaptureQueriesContext(connection) as queries:
        client.get("/dashboard/", params)
    slowest = max(float(query["time"]) for query in queries.captured_queries)
    return statistics.median(samples), len(queries), slowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--weeks", type=int, default=12)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--seed", type=int, default=2019)
    args = parser.parse_args()

    var_dir = setup_django(database_url=os.environ.get("DATABASE_URL"))  # PostgreSQL's, where set (a scratch one)
    from django.conf import settings
    from django.db import connection
    from django.db.models import Count
    from django.test import Client
    from django.utils import timezone

    from fc2.models import Job

    # As served: no query log (CaptureQueriesContext still counts where asked), and no setup_test_environment(),
    # whose template instrumentation copies the context at every {% include %}.
    settings.DEBUG = False
    Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
    old_name = connection.settings_dict["NAME"]
    if connection.vendor != "sqlite":
        connection.settings_dict["TEST"]["NAME"] = f"{old_name}_dashbench_{os.getpid()}"
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        started = time.perf_counter()
        staff = seed(args.jobs, args.users, args.weeks, random.Random(args.seed))
        seeded_s = time.perf_counter() - started
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(staff)

        some_job = Job.objects.filter(state="failed").order_by("pk").values_list("pk", flat=True).first()
        two_weeks_ago = (timezone.now() - timedelta(days=13)).date().isoformat()
        cases = {
            "no filter (newest first)": {},
            "state=failed": {"state": "failed"},
            "state=active": {"state": "active"},
            "provider=aws & user=user07": {"provider": "aws", "user": "user07"},
            "last 14 days": {"created_from": two_weeks_ago},
            "search user 'user1'": {"q": "user1"},
            "search reason 'OOM'": {"q": "OOM"},
            f"search id '#{some_job}'": {"q": f"#{some_job}"},
            "sort -cost": {"sort": "-cost"},
            "sort duration": {"sort": "duration"},
            "sort user, page 40": {"sort": "user", "page": 40},
            "all combined, page 2": {
                "state": "succeeded",
                "provider": "aws",
                "created_from": two_weeks_ago,
                "q": "user",
                "sort": "-cost",
                "page": 2,
            },
        }
        engine = f"{connection.display_name} {'.'.join(map(str, connection.get_database_version()))}"
        by_state = dict(Job.objects.order_by().values_list("state").annotate(n=Count("pk")))
        print(
            f"{engine}: {Job.objects.count():,} jobs of {args.users} users over {args.weeks} weeks, seeded in "
            f"{seeded_s:.1f} s ({', '.join(f'{s} {n}' for s, n in sorted(by_state.items()))}); "
            f"median of {args.requests} requests"
        )
        healthz = statistics.median(_time(client, "/healthz") for _ in range(args.requests))
        print(f"{'/healthz (one SELECT 1, for scale)':<36} {healthz * 1000:8.2f} ms")
        print(f"{'/dashboard/ with':<36} {'median':>11} {'queries':>8} {'slowest query':>14}")
        for label, params in cases.items():
            median, count, slowest = measure(client, params, args.requests)
            print(f"{label:<36} {median * 1000:8.2f} ms {count:8d} {slowest * 1000:11.2f} ms")
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        shutil.rmtree(var_dir, ignore_errors=True)


def _time(client, url: str) -> float:
    start = time.perf_counter()
    client.get(url)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
