"""Where the database can say it is unchanged, the answer cache (fc2/answer_cache.py) makes a caller's checks once and
trusts them again only while it says so and nothing they passed by has run out: a change committed by another process,
or written by this one, and a session's or token's expiry, or the minute after which a token's use is written down
again, each make the checks again — and then Django's own refusal or new answer is what the caller gets.

The database says so on SQLite (`PRAGMA data_version` and the connection's own changes) and on PostgreSQL (the
notifications of migration fc2/0014's triggers). CI runs the suite on PostgreSQL: there the last test runs this module
again in a pytest of its own on a scratch SQLite database, the platform's embedded one."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.core.cache import caches
from django.core.handlers.wsgi import WSGIHandler
from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fc2 import answer_cache, answer_triggers
from fc2.answer_cache import AnswerCache
from fc2.models import API_TOKEN_TOUCH_S, ApiToken
from recommender.models import PerformanceRecord
from tests import test_answer_cache
from tests.conftest import PROJECT_DIR
from tests.test_answer_cache import as_django_alone_answers, call
from tests.test_recommender_interfaces import fc2_catalog, table4  # noqa: F401 -- fixtures, used below
from tests.test_speed_paths import in_another_process

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("table4")]
session, token = test_answer_cache.session, test_answer_cache.token  # alice's session cookie, and her API token


@pytest.fixture(autouse=True)
def _on_a_database_that_says(request):
    if connection.vendor not in ("sqlite", "postgresql"):
        pytest.skip("a database that says it is unchanged: SQLite or PostgreSQL")


@pytest.fixture
def app():
    """The platform's WSGI application as fc2/wsgi.py makes it, fresh, the connections looked after for real."""
    made = AnswerCache(WSGIHandler())
    assert made.off_because is None
    return made


def trusted(app, **credentials) -> list:
    """Requests until an answer is given again without a query (the checks trusted), each compared with Django's
    alone: Django's answer, the checks made, then for a session its expiry read once, then none."""
    answers = [as_django_alone_answers(app, **credentials) for _ in range(4)]
    assert [(a.status, a.by_django) for a in answers] == [(200, True)] + [(200, False)] * 3
    queries = [a.queries for a in answers[1:]]
    assert queries in ([2, 1, 0], [2, 0, 0]), queries  # the user (or token), the stamps; a session's expiry
    return answers


class Clock:
    """answer_cache's clock, moved on at will (Django's and the database's stay where they are)."""

    def __init__(self, monkeypatch):
        self.ahead = 0.0
        monkeypatch.setattr(answer_cache.time, "time", lambda: self.real() + self.ahead)

    real = staticmethod(time.time)


def test_the_checks_are_made_once_while_the_database_is_unchanged(app, session):
    trusted(app, cookie=session)

    assert all(call(app, cookie=session).queries == 0 for _ in range(5))


@pytest.mark.parametrize(
    ("change", "status", "says"),
    [
        ("User.objects.filter(username='alice').update(is_active=False)", 401, b"not provided"),
        (
            "u = User.objects.get(username='alice'); u.set_password('another-password-2'); u.save()",
            401,
            b"not provided",
        ),
        ("SessionStore(KEY).delete()", 401, b"not provided"),  # signed out, in another process
        (
            "PerformanceRecord.objects.create(workload='mnist', workers=2, batch_size=6400, latency_ms=0, "
            "epoch_time_s=40, strategy='mirrored')",
            200,
            b'"workers":2',
        ),
    ],
    ids=["deactivated", "password-changed", "signed-out", "record-added"],
)
def test_a_change_another_process_commits_is_seen_at_once(app, session, change, status, says):
    trusted(app, cookie=session)
    key = session.removeprefix("sessionid=")

    in_another_process(
        "from django.contrib.auth import get_user_model\n"
        "from django.contrib.sessions.backends.cached_db import SessionStore\n"
        "from recommender.models import PerformanceRecord\n"
        f"User, KEY = get_user_model(), {key!r}\n{change}"
    )
    answer = as_django_alone_answers(app, cookie=session)

    assert answer.status == status and says in answer.body


def test_any_other_change_makes_the_checks_again_and_the_answer_stands(app, session):
    trusted(app, cookie=session)

    in_another_process("from django.contrib.auth import get_user_model\nget_user_model().objects.create(username='x')")
    again = as_django_alone_answers(app, cookie=session)
    assert again.status == 200 and not again.by_django and again.queries == 2
    assert [call(app, cookie=session).queries for _ in range(2)] == [1, 0]  # the session's expiry read, then none


def test_a_change_this_process_writes_is_seen_at_once(app, session, alice):
    trusted(app, cookie=session)

    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)

    assert as_django_alone_answers(app, cookie=session).status == 401


def test_a_new_connection_that_counts_as_the_last_one_did_makes_the_checks_again(app, session):
    connection.close()  # from here a connection that writes nothing, and sees no other's change before the next
    trusted(app, cookie=session)
    in_another_process("from django.contrib.auth import get_user_model\nget_user_model().objects.update(is_active=0)")

    connection.close()  # its successor's counters start where this one's were (nothing written, no change seen)

    assert as_django_alone_answers(app, cookie=session).status == 401


def test_a_session_that_expired_is_refused(app, client, alice):
    client.force_login(alice)
    stored = client.session
    stored.set_expiry(3)
    stored.save()
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    for _ in range(4):
        assert call(app, cookie=cookie).status == 200

    time.sleep(3.2)

    assert as_django_alone_answers(app, cookie=cookie).status == 401


@pytest.fixture
def clock(monkeypatch) -> Clock:
    return Clock(monkeypatch)


def test_the_checks_are_made_again_when_the_session_expires(app, client, alice, clock):
    client.force_login(alice)
    stored = client.session
    stored.set_expiry(600)
    stored.save()
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    trusted(app, cookie=cookie)

    clock.ahead = 590
    assert call(app, cookie=cookie).queries == 0
    clock.ahead = 601
    assert call(app, cookie=cookie).queries > 0  # (and Django, whose clock has not moved, lets it in)


def test_the_checks_are_made_again_when_the_token_expires(app, alice, token, clock):
    ApiToken.objects.filter(user=alice).update(expires_at=timezone.now() + timedelta(seconds=30))
    trusted(app, **token)

    clock.ahead = 25
    assert call(app, **token).queries == 0
    clock.ahead = 31
    assert call(app, **token).queries > 0


def test_a_token_s_use_is_still_written_down_each_minute(app, alice, token, clock):
    trusted(app, **token)
    last_used = ApiToken.objects.get(user=alice).last_used_at

    clock.ahead = API_TOKEN_TOUCH_S - 5
    assert call(app, **token).queries == 0
    earlier = last_used - timedelta(seconds=API_TOKEN_TOUCH_S + 1)
    ApiToken.objects.filter(user=alice).update(last_used_at=earlier)  # (as if a minute had passed on every clock)
    clock.ahead = API_TOKEN_TOUCH_S + 1
    again = call(app, **token)

    assert again.status == 200 and again.queries > 0
    assert ApiToken.objects.get(user=alice).last_used_at > earlier + timedelta(seconds=API_TOKEN_TOUCH_S)


class Thread:
    """A thread of its own, with its own connection to the database, as a threaded server's (gthread, waitress)."""

    def __init__(self, name: str) -> None:
        self.jobs, self.results = queue.Queue(), queue.Queue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                self.results.put(job())
            except BaseException as error:  # (handed to the test)
                self.results.put(error)
        connection.close()

    def send(self, job) -> None:
        self.jobs.put(job)

    def result(self):
        result = self.results.get(timeout=60)
        if isinstance(result, BaseException):
            raise result
        return result

    def run(self, job):
        self.send(job)
        return self.result()

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(30)


@pytest.fixture
def threads():
    made = []
    yield lambda name: made.append(Thread(name)) or made[-1]
    for thread in made:
        thread.stop()


def test_each_thread_s_connection_trusts_the_checks_it_made(app, session, threads):
    first, second = threads("first"), threads("second")
    first.run(lambda: call(app, cookie=session))  # Django's answer, kept

    queries = [[thread.run(lambda: call(app, cookie=session)).queries for thread in (first, second)] for _ in range(4)]

    assert queries == [[2, 2], [1, 1], [0, 0], [0, 0]]


def test_an_older_answer_stored_late_is_checked_not_trusted(app, session, threads):
    """A slow request's answer, made before a record was added, is stored after this thread's checks of the new
    answer passed: the next request gets the answer of the records as they are."""
    django = app.app
    paused, resume = threading.Event(), threading.Event()

    def slowly(environ, start_response):
        response = django(environ, start_response)
        if threading.current_thread().name == "slow":
            paused.set()
            resume.wait(30)
        return response

    app.app = slowly
    slow = threads("slow")
    slow.send(lambda: call(app, cookie=session))
    assert paused.wait(30)
    PerformanceRecord.objects.create(
        workload="mnist", workers=2, batch_size=6400, latency_ms=0, epoch_time_s=40, strategy="mirrored"
    )
    assert json.loads(trusted(app, cookie=session)[-1].body)["workers"] == 2
    resume.set()
    assert json.loads(slow.result().body)["workers"] == 4  # kept, in place of the new one

    again = as_django_alone_answers(app, cookie=session)

    assert json.loads(again.body)["workers"] == 2 and again.queries > 0


def _tables_read(sql: str) -> set[str]:
    return set(re.findall(r'(?:FROM|JOIN)\s+"?(\w+)"?', sql))


def _triggered_tables() -> dict[str, int]:
    """Each table with a trigger named as fc2/answer_triggers.py names them, and how many."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT c.relname, count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "WHERE t.tgname = %s AND t.tgenabled = 'O' GROUP BY c.relname",
                [answer_triggers.NAME],
            )
        else:
            cursor.execute(
                "SELECT tbl_name, count(*) FROM sqlite_master WHERE type = 'trigger' AND substr(name, 1, %s) = %s "
                "GROUP BY tbl_name",
                [len(answer_triggers.NAME), answer_triggers.NAME],
            )
        return dict(cursor.fetchall())


def refused_once_alice_is_deactivated(app, cookie: str) -> bool:
    """Whether a change committed by another process is told here: alice deactivated there, refused here."""
    in_another_process("from django.contrib.auth import get_user_model\nget_user_model().objects.update(is_active=0)")
    time.sleep(0.05)  # (what a notification takes to arrive)
    return as_django_alone_answers(app, cookie=cookie).status == 401


def test_the_triggers_watch_every_table_the_checks_read(app, session, token):
    read = set()
    for credentials in ({"cookie": session}, token):
        call(app, **credentials)  # Django's answer
        caches[settings.SESSION_CACHE_ALIAS].clear()  # (so that the session is read from its table)
        with CaptureQueriesContext(connection) as checks:
            trusted_answers = [call(app, **credentials) for _ in range(3)]  # the checks, a session's expiry, none
        assert trusted_answers[-1].queries == 0
        read |= {table for query in checks.captured_queries for table in _tables_read(query["sql"])}
    triggered = _triggered_tables()

    assert Session._meta.db_table in read and read <= set(answer_triggers.watched_tables()) == set(triggered)
    assert set(triggered.values()) == {1 if connection.vendor == "postgresql" else 3}  # (SQLite: one for each write)


def test_a_commit_to_any_other_table_keeps_the_checks_trusted(app, session):
    trusted(app, cookie=session)

    in_another_process(
        "from django.contrib.contenttypes.models import ContentType\n"
        "ContentType.objects.create(app_label='elsewhere', model='anything')"
    )
    time.sleep(0.05)

    assert call(app, cookie=session).queries == 0
    assert refused_once_alice_is_deactivated(app, session)  # (and a change that counts is still told)


def test_a_change_rolled_back_tells_nothing(app, session, alice):
    trusted(app, cookie=session)
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(f"UPDATE {get_user_model()._meta.db_table} SET is_active = false WHERE id = %s", [alice.pk])
            cursor.execute("ROLLBACK")
    finally:
        other.close()
    time.sleep(0.05)

    assert call(app, cookie=session).queries == 0
    assert refused_once_alice_is_deactivated(app, session)


@pytest.fixture
def triggers_back():
    """The triggers made again after the test, whatever it did to them."""
    yield
    answer_triggers.create(connection)


def test_a_trigger_lost_while_a_connection_trusts_is_told_at_once(app, session, triggers_back):
    trusted(app, cookie=session)
    table = get_user_model()._meta.db_table

    # As a migration that rebuilds a table (SQLite) or is rolled back (PostgreSQL: the triggers dropped) would.
    if connection.vendor == "sqlite":
        in_another_process(
            f"from django.db import connection\nconnection.cursor().execute('DROP TRIGGER "
            f'"{answer_triggers.NAME}_update_{table}"\')'
        )
    else:
        in_another_process("from django.db import connection\nfrom fc2 import answer_triggers\n"
                           "answer_triggers.drop(connection)")  # fmt: skip

    assert refused_once_alice_is_deactivated(app, session)


def test_triggers_lost_and_made_again_meanwhile_begin_anew(app, session, triggers_back):
    """What was trusted before cannot be trusted after: a change made while they were gone was told to nobody."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's schema_version (PostgreSQL's listeners are told of the drop: the test above)")
    trusted(app, cookie=session)
    table = get_user_model()._meta.db_table

    in_another_process(
        "from django.db import connection\nfrom django.contrib.auth import get_user_model\n"
        "from fc2 import answer_triggers\n"
        f"connection.cursor().execute('DROP TRIGGER \"{answer_triggers.NAME}_update_{table}\"')\n"
        "get_user_model().objects.update(is_active=0)\nanswer_triggers.create(connection)"
    )

    assert as_django_alone_answers(app, cookie=session).status == 401


def test_without_its_triggers_nothing_is_trusted(app, session, caplog, triggers_back):
    answer_triggers.drop(connection)

    answers = [call(app, cookie=session) for _ in range(4)]

    assert [a.queries for a in answers[1:]] == [2, 2, 2]
    assert caplog.text.count("triggers are missing") == 1  # (once a connection)


def test_a_trigger_disabled_is_missing(app, session, triggers_back):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's ALTER TABLE … DISABLE TRIGGER")
    table = connection.ops.quote_name(get_user_model()._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} ENABLE REPLICA TRIGGER {answer_triggers.NAME}")
    connection.close()

    answers = [call(app, cookie=session) for _ in range(4)]

    assert [a.queries for a in answers[1:]] == [2, 2, 2]


def test_migrate_makes_the_triggers_a_later_migration_lost(triggers_back):
    made = _triggered_tables()
    with connection.cursor() as cursor:  # as SQLite's schema editor does when it rebuilds a table to alter it
        if connection.vendor == "sqlite":
            cursor.execute(f'DROP TRIGGER "{answer_triggers.NAME}_insert_fc2_apitoken"')
        else:
            cursor.execute(f"DROP TRIGGER {answer_triggers.NAME} ON fc2_apitoken")
    assert _triggered_tables() != made

    call_command("migrate", verbosity=0)

    assert _triggered_tables() == made


def test_the_triggers_go_and_come_back_with_their_migration(triggers_back):
    call_command("migrate", "fc2", "0013", verbosity=0)
    assert _triggered_tables() == {}

    call_command("migrate", verbosity=0)
    assert set(_triggered_tables()) == set(answer_triggers.watched_tables())


def test_an_error_while_the_triggers_are_looked_for_makes_the_checks(app, session, monkeypatch):
    found = answer_triggers.found

    def fails_once(*args):
        monkeypatch.setattr(answer_triggers, "found", found)
        raise connection.Database.OperationalError("canceling statement due to statement timeout")

    connection.close()
    monkeypatch.setattr(answer_triggers, "found", fails_once)
    answers = [as_django_alone_answers(app, cookie=session) for _ in range(5)]

    assert [a.status for a in answers] == [200] * 5
    assert [a.queries for a in answers[1:]][-1] == 0  # (trusted once looked for again)


def test_on_postgresql_nothing_is_trusted_until_a_notification_of_its_own_comes_back(app, session, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's notifications")
    told = answer_cache._told

    def pings_lost(raw, state):  # (as behind a proxy that does not pass them on)
        raw.notifies[:] = [n for n in raw.notifies if not n.payload.startswith("ping:")]
        told(raw, state)

    monkeypatch.setattr(answer_cache, "_told", pings_lost)
    connection.close()
    call(app, cookie=session)  # Django's answer

    assert [call(app, cookie=session).queries for _ in range(3)] == [2, 2, 2]


def test_on_postgresql_each_epoch_is_proven_again_after_a_heartbeat(app, session, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's notifications")
    trusted(app, cookie=session)
    ahead = time.monotonic() + answer_cache.HEARTBEAT_S + 1
    monkeypatch.setattr(answer_cache.time, "monotonic", lambda: ahead)

    assert [call(app, cookie=session).queries for _ in range(3)] in ([2, 1, 0], [2, 0, 0])  # a new epoch


def test_this_module_passes_on_sqlite(tmp_path):
    if connection.vendor == "sqlite":
        pytest.skip("run above, on this database")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["FC2_VAR_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env, cwd=PROJECT_DIR, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in summary and not re.search(r"failed|error", summary), summary
