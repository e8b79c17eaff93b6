"""What makes every signed-in API request cheap must not make it any less safe: the user is read from the database on
every request (a password changed or an account deactivated anywhere counts at once), a request that has no use for
the user loads none, the renderer is DRF's choice, and the database connection each process keeps
between requests sees what other processes commit. How fast it is, benchmarks/lookup_speed.py measures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from fc2.accounts import UserBackend, load_user
from tests.conftest import PROJECT_DIR
from tests.helpers import in_another_process

pytestmark = pytest.mark.django_db


def me(client) -> int:
    return client.get(reverse("api-me")).status_code


# --- the signed-in user -------------------------------------------------------------------------------------------


def test_the_user_is_read_as_the_orm_reads_it(alice):
    alice.last_login = alice.date_joined
    alice.save()
    orm = get_user_model().objects.get(pk=alice.pk)

    loaded = load_user(alice.pk)

    fields = [field.attname for field in get_user_model()._meta.concrete_fields]
    assert [(getattr(loaded, f), type(getattr(loaded, f))) for f in fields] == [
        (getattr(orm, f), type(getattr(orm, f))) for f in fields
    ]
    assert loaded.last_login.tzinfo is not None and loaded._state.adding is False and loaded._state.db == "default"
    assert loaded.check_password("alice-password-1")


def test_a_session_signed_in_before_the_backend_existed_stays_signed_in(client, alice):
    """Its session names Django's ModelBackend: upgrading must not sign every user out."""
    client.force_login(alice, backend="django.contrib.auth.backends.ModelBackend")

    assert client.get(reverse("api-me")).json()["username"] == "alice"


@pytest.mark.parametrize(("password", "signed_in"), [("alice-password-1", True), ("wrong", False)])
def test_signing_in_checks_the_password_once(client, alice, password, signed_in):
    with mock.patch.object(
        type(alice), "check_password", autospec=True, side_effect=type(alice).check_password
    ) as check:
        answer = client.post(reverse("login"), {"username": "alice", "password": password})

    assert check.call_count == 1  # a refusal stops at the first backend: no second hash of a wrong password
    assert (answer.status_code == 302) is signed_in
    assert (client.get(reverse("api-me")).status_code == 200) is signed_in


def test_no_such_user_is_none(alice):
    assert load_user(alice.pk + 1000) is None
    assert UserBackend().get_user(alice.pk + 1000) is None


def test_a_password_changed_behind_the_orm_s_back_ends_the_session(client, alice):
    """No signal, no save(): nothing could have told a cache, so the user must not come from one."""
    client.force_login(alice)
    assert me(client) == 200

    get_user_model().objects.filter(pk=alice.pk).update(password="md5$other$0123456789abcdef")

    assert me(client) in (401, 403)


def test_an_account_deactivated_behind_the_orm_s_back_is_refused_at_once(client, alice):
    client.force_login(alice)
    assert me(client) == 200

    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)

    assert me(client) in (401, 403)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "change",
    [
        "user.set_password('another-password-2')\nuser.save()",
        "user.is_active = False\nuser.save()",
        "user.delete()",
    ],
    ids=["password", "deactivated", "deleted"],
)
def test_a_user_changed_in_another_process_is_refused_here_at_once(client, alice, change):
    client.force_login(alice)
    assert me(client) == 200  # this process has read the user, and keeps its database connection

    in_another_process(
        f"from django.contrib.auth.models import User\nuser = User.objects.get(username='alice')\n{change}"
    )

    assert me(client) in (401, 403)


def test_a_request_with_no_use_for_the_user_loads_neither_user_nor_session(client, alice):
    client.force_login(alice)

    with CaptureQueriesContext(connection) as queries:
        assert client.get(reverse("healthz")).status_code == 200

    assert [q["sql"] for q in queries.captured_queries] == ["SELECT 1"]


def test_a_signed_in_api_request_reads_the_database_once(client, alice, django_assert_max_num_queries):
    """For its user: the session comes from the shared cache once it is there."""
    client.force_login(alice)
    me(client)

    with django_assert_max_num_queries(1):
        assert me(client) == 200


# --- content negotiation ----------------------------------------------------------------------------------------------


def test_the_api_still_answers_each_accept_header_as_drf_does(client, alice):
    client.force_login(alice)
    url = reverse("api-me")

    for _ in range(2):
        assert client.get(url).json()["username"] == "alice"
        assert client.get(url, HTTP_ACCEPT="text/html")["Content-Type"].startswith("text/html")  # the browsable API
        assert client.get(url, HTTP_ACCEPT="application/xml").status_code == 406


# --- database connections -----------------------------------------------------------------------------------------


def settings_in_a_fresh_process(tmp_path, **env: str) -> dict:
    script = "import json, django; django.setup(); from django.conf import settings; "
    script += "print(json.dumps(settings.DATABASES['default'], default=str))"
    base = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "fc2.settings", "FC2_VAR_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env={**base, "DEBUG": "1", **env}, cwd=PROJECT_DIR, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_connections_are_kept_between_requests_and_checked_before_reuse(tmp_path):
    kept = settings_in_a_fresh_process(tmp_path)
    per_request = settings_in_a_fresh_process(tmp_path, DB_CONN_MAX_AGE="0")

    assert (kept["CONN_MAX_AGE"], kept["CONN_HEALTH_CHECKS"]) == (600, True)
    assert per_request["CONN_MAX_AGE"] == 0
