"""The recommender's one memo (recommender/service.py) and its staleness bound: the platform's own writes in this
process are seen at once (a record saved, deleted or imported, a type repriced), any other write — a bulk update, raw
SQL, another process — within FC2_RECOMMEND_MEMO_S; and the migrations that made, then dropped, the triggers of the
response cache that stood ahead of Django before it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from io import StringIO

import psycopg2
import pytest
from django.core.management import call_command
from django.db import connection

from recommender import service
from recommender.models import InstanceType, PerformanceRecord
from recommender.types import RecommendRequest
from tests.conftest import PROJECT_DIR

pytestmark = pytest.mark.usefixtures("fc2_catalog")  # the paper's catalogue, for every test
# Table 4 as workload "mnist": at batch 6400 and 0 ms, 4 workers take 57 s an epoch, the fastest.
LOOKUP = RecommendRequest(algorithm="lookup", workload="mnist", batch_size=6400, latency_ms=0.0)
SHORT_S = 0.2


def answer() -> tuple[int, float]:
    found = service.recommend(LOOKUP)
    return found.workers, found.predicted_epoch_time_s


@pytest.fixture
def memo_s(settings):
    """Sets FC2_RECOMMEND_MEMO_S (for what is kept from then on)."""

    def set_to(seconds: float) -> None:
        settings.FC2_RECOMMEND_MEMO_S = seconds

    return set_to


@pytest.mark.django_db
class TestWritesOfThisProcess:
    """Seen at once, however long the memo keeps answers."""

    @pytest.fixture(autouse=True)
    def _long_memo(self, memo_s, fc2_catalog, table4):
        memo_s(3600)
        assert answer() == (4, 57)  # kept now

    def test_a_record_saved(self):
        PerformanceRecord.objects.create(workload="mnist", workers=2, batch_size=6400, latency_ms=0, epoch_time_s=40)
        assert answer() == (2, 40)

    def test_a_record_changed(self):
        record = PerformanceRecord.objects.get(workload="mnist", workers=4, batch_size=6400, latency_ms=0)
        record.epoch_time_s = 200
        record.save()
        assert answer()[0] != 4

    def test_a_record_deleted(self):
        PerformanceRecord.objects.filter(workload="mnist", workers=4, batch_size=6400, latency_ms=0).delete()
        assert answer() == (1, 96)

    def test_records_imported(self, tmp_path):
        faster = tmp_path / "faster.csv"
        faster.write_text("workload,workers,batch_size,latency_ms,epoch_time_s\nmnist,3,6400,0,30\n")
        call_command("import_perf_data", str(faster), "--format", "csv", stdout=StringIO())
        assert answer() == (3, 30)

    def test_a_type_repriced(self):
        request = RecommendRequest(
            algorithm="cost-opt", ps_type="m4.large", worker_types=("t2.xlarge", "c4.xlarge"), max_workers=2
        )
        assert service.recommend(request).worker_type == "c4.xlarge"  # $0.231/h against $0.2336/h
        c4 = InstanceType.objects.get(catalog__name="fc2-2018", name="c4.xlarge")
        c4.hourly_price = "0.3"
        c4.save()
        assert service.recommend(request).worker_type == "t2.xlarge"


def write_behind_the_orm(how: str) -> None:
    """4 workers at 6400/0 ms made slower than 1 worker, without a model's save."""
    if how == "bulk update":
        PerformanceRecord.objects.filter(workload="mnist", workers=4, batch_size=6400, latency_ms=0).update(
            epoch_time_s=500
        )
    else:
        table = connection.ops.quote_name(PerformanceRecord._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET epoch_time_s = 500 WHERE workload = 'mnist' AND workers = 4 "
                "AND batch_size = 6400 AND latency_ms = 0"
            )


@pytest.mark.django_db
@pytest.mark.usefixtures("table4")
@pytest.mark.parametrize("how", ["raw SQL", "bulk update"])
def test_a_write_behind_the_orm_is_seen_once_the_memo_runs_out(memo_s, how):
    memo_s(SHORT_S)
    assert answer() == (4, 57)

    write_behind_the_orm(how)
    time.sleep(SHORT_S * 1.5)

    assert answer() == (1, 96)


@pytest.mark.django_db
@pytest.mark.usefixtures("table4")
def test_an_answer_runs_out_with_the_records_it_came_from(memo_s):
    """Not FC2_RECOMMEND_MEMO_S after it was computed, from records kept nearly that long already: the bound would be
    twice the setting."""
    memo_s(4 * SHORT_S)
    began = time.monotonic()
    assert answer() == (4, 57)  # the records read now
    time.sleep(2 * SHORT_S)
    write_behind_the_orm("raw SQL")
    another = RecommendRequest(algorithm="lookup", workload="mnist", batch_size=6400, latency_ms=0.0, max_workers=8)
    assert service.recommend(another).workers == 4  # from the records kept since `began`

    time.sleep(max(0.0, began + 4 * SHORT_S + 0.05 - time.monotonic()))

    assert service.recommend(another).workers == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("table4")
def test_a_write_behind_the_orm_may_go_unseen_while_the_memo_holds(memo_s):
    """The bound is the TTL, not better: what is kept is given again until then."""
    memo_s(3600)
    assert answer() == (4, 57)

    write_behind_the_orm("raw SQL")

    assert answer() == (4, 57)
    service.forget()
    assert answer() == (1, 96)


@pytest.mark.django_db
@pytest.mark.usefixtures("table4")
def test_no_memo_at_zero(memo_s):
    memo_s(0)
    first = service.recommend(LOOKUP)

    assert service.recommend(LOOKUP) is not first
    write_behind_the_orm("raw SQL")
    assert answer() == (1, 96)


# --- the triggers of the old response cache ---------------------------------------------------------------------------

MIGRATE_SCRIPT = """
import json, django
django.setup()
from django.core.management import call_command
from django.db import connection

def triggers():
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' OR name = 'fc2_answer_checks'")
        else:
            cursor.execute(
                "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
                "UNION SELECT proname FROM pg_proc WHERE proname LIKE 'fc2_answer_checks%'"
            )
        return sorted({row[0] for row in cursor.fetchall()})

seen = {}
for step, target in [("0014", ["fc2", "0014"]), ("latest", []), ("back to 0014", ["fc2", "0014"]),
                     ("latest again", []), ("fc2 zero", ["fc2", "zero"])]:
    call_command("migrate", *target, verbosity=0)
    seen[step] = triggers()
print(json.dumps(seen))
"""


def postgres_server() -> str | None:
    """A PostgreSQL server to make a scratch database on: this run's, or one on 127.0.0.1 (None: none answers)."""
    url = os.environ.get("DATABASE_URL", "")
    url = url if url.startswith("postgres") else "postgres://postgres@127.0.0.1:5432/postgres"
    try:
        psycopg2.connect(url, connect_timeout=2).close()
    except psycopg2.Error:
        return None
    return url


def admin(url: str, sql: str) -> None:
    db = psycopg2.connect(url)
    db.autocommit = True
    try:
        db.cursor().execute(sql)
    finally:
        db.close()


@pytest.mark.parametrize("vendor", ["sqlite", "postgresql"])
def test_migrations_make_then_drop_the_triggers_and_go_back(vendor, tmp_path):
    name = f"fc2_migrations_{uuid.uuid4().hex[:8]}"
    if vendor == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    else:
        server = postgres_server()
        if server is None:
            pytest.skip("no PostgreSQL server answers")
        admin(server, f'CREATE DATABASE "{name}"')
        url = server.rsplit("/", 1)[0] + f"/{name}"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "fc2.settings_test",
        "FC2_VAR_DIR": str(tmp_path),
    }
    try:
        done = subprocess.run(
            [sys.executable, "-c", MIGRATE_SCRIPT],
            env=env,
            cwd=PROJECT_DIR,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        if vendor == "postgresql":
            admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert seen["0014"]  # what 0014 made, as it always has
    assert all(name.startswith("fc2_answer_checks") for name in seen["0014"])
    assert seen["latest"] == seen["back to 0014"] == seen["latest again"] == seen["fc2 zero"] == []
