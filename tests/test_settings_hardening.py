"""Safe defaults and small holes: DEBUG and SECRET_KEY, mail for password reset, the API schema, the admin.

Settings are loaded in a subprocess with an environment built from scratch, as a deployment would start them; the
rest goes through the test client.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core import mail
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from fc2.models import Artifact, Job, JobEvent, Node
from tests.conftest import PROJECT_DIR

SHOWN = ("DEBUG", "SECRET_KEY", "EMAIL_BACKEND", "FC2_EMAIL_ENABLED", "DEFAULT_FROM_EMAIL")
SMTP = ("EMAIL_HOST", "EMAIL_PORT", "EMAIL_HOST_USER", "EMAIL_HOST_PASSWORD", "EMAIL_USE_TLS", "EMAIL_USE_SSL")


def load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`django.setup()` in a fresh process whose environment holds only `env` (plus what Python needs)."""
    script = (
        "import json, django; django.setup(); from django.conf import settings; "
        f"print(json.dumps({{name: getattr(settings, name, None) for name in {SHOWN + SMTP!r}}}))"
    )
    base = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "fc2.settings", "FC2_VAR_DIR": str(tmp_path / "var")}
    return subprocess.run(
        [sys.executable, "-c", script], env={**base, **env}, cwd=PROJECT_DIR, capture_output=True, text=True, timeout=60
    )


def manage_py(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`manage.py ARGS` in a fresh shell: PATH, a data directory of its own, and `env`."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        env={"PATH": os.environ["PATH"], "FC2_VAR_DIR": str(tmp_path / "var"), **env},
        cwd=PROJECT_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )


def loaded(tmp_path: Path, **env: str) -> dict:
    result = load_settings(tmp_path, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def refused(tmp_path: Path, **env: str) -> str:
    """The ImproperlyConfigured message the settings stopped with."""
    result = load_settings(tmp_path, **env)
    assert result.returncode != 0, result.stdout
    assert "ImproperlyConfigured" in result.stderr
    return result.stderr.strip().splitlines()[-1]


# --- DEBUG and SECRET_KEY ---


def test_debug_is_off_unless_asked_for(tmp_path):
    assert loaded(tmp_path, SECRET_KEY="a-real-key")["DEBUG"] is False


@pytest.mark.parametrize("value", ["1", "true", "yes", "on"])
def test_debug_on_takes_the_development_key(tmp_path, value):
    """What `make run` does: DEBUG=1 and no key."""
    shown = loaded(tmp_path, DEBUG=value)

    assert shown["DEBUG"] is True
    assert shown["SECRET_KEY"] == "dev-only-insecure-key"


@pytest.mark.parametrize(
    ("env", "debug"),
    [
        ({"DEBUG": "TRUE"}, True),
        ({"DEBUG": " On "}, True),
        ({"DEBUG": "No", "SECRET_KEY": "a-real-key"}, False),
        ({"DEBUG": "0", "SECRET_KEY": "a-real-key"}, False),
        ({"DEBUG": "OFF", "SECRET_KEY": "a-real-key"}, False),
        ({"DEBUG": "", "SECRET_KEY": "a-real-key"}, False),  # blank: the default
        ({"DEBUG": "  ", "SECRET_KEY": "a-real-key"}, False),
    ],
)
def test_a_boolean_takes_its_words_in_any_case(tmp_path, env, debug):
    assert loaded(tmp_path, **env)["DEBUG"] is debug


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DEBUG", "ture"),
        ("DEBUG", "2"),
        ("DEBUG", "y"),
        ("FC2_UNSANDBOXED_LOCAL_JOBS", "enabled"),
        ("FC2_AWS_PLACEMENT_GROUPS", "-1"),
        ("SECURE_COOKIES", "fasle"),
        ("SECURE_SSL_REDIRECT", "true!"),
    ],
)
def test_a_boolean_with_a_typo_stops_the_start(tmp_path, name, value):
    """A typo must not quietly mean false (DEBUG=ture would serve production settings to a developer, and
    SECURE_COOKIES=fasle would turn secure cookies off): the message names the variable, the value and the words."""
    env = {"DEBUG": "false", "SECRET_KEY": "a-real-key", name: value}

    assert refused(tmp_path, **env).endswith(
        f"{name} must be one of 1/true/yes/on/0/false/no/off (any case), got {value!r}"
    )


def test_a_boolean_mail_setting_with_a_typo_stops_the_start(tmp_path):
    env = {"SECRET_KEY": "a-real-key", "EMAIL_HOST": "smtp.example.org", "EMAIL_USE_TLS": "tru"}

    assert refused(tmp_path, **env).endswith(
        "EMAIL_USE_TLS must be one of 1/true/yes/on/0/false/no/off (any case), got 'tru'"
    )


def test_manage_py_says_a_boolean_typo_in_one_line(tmp_path):
    result = manage_py(tmp_path, "check", DEBUG="ture")

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: DEBUG must be one of 1/true/yes/on/0/false/no/off (any case), got 'ture'"
    ]


def test_without_debug_a_key_is_required(tmp_path):
    message = refused(tmp_path)

    assert "SECRET_KEY (or SECRET_KEY_FILE) must be set when DEBUG is off" in message


def test_a_checkout_make_run_set_up_runs_its_commands_with_make_runs_defaults(tmp_path):
    """`make run` marks its data directory (Makefile, setup): the README's `manage.py` lines then work in a fresh
    shell; an explicit DEBUG still wins, and a data directory never marked stays off."""
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "development").touch()

    assert loaded(tmp_path)["DEBUG"] is True
    assert loaded(tmp_path)["SECRET_KEY"] == "dev-only-insecure-key"
    assert "must be set when DEBUG is off" in refused(tmp_path, DEBUG="false")


def test_manage_py_says_a_missing_setting_in_one_line(tmp_path):
    """A newcomer's command in a shell with nothing set: one line saying what to set, never a traceback."""
    result = manage_py(tmp_path, "recommend", "--algorithm", "cost-opt", "--budget", "2")

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: SECRET_KEY (or SECRET_KEY_FILE) must be set when DEBUG is off; for development, run `make run` once "
        "in this checkout, or set DEBUG=1"
    ]


def test_key_from_the_environment_or_a_file(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-a-file\n")

    assert loaded(tmp_path, SECRET_KEY="from-the-env")["SECRET_KEY"] == "from-the-env"
    assert loaded(tmp_path, SECRET_KEY_FILE=str(key_file))["SECRET_KEY"] == "from-a-file"
    assert "cannot be read" in refused(tmp_path, SECRET_KEY_FILE=str(tmp_path / "missing"))


@pytest.mark.parametrize("debug", ["0", "1"])
@pytest.mark.parametrize("blank", ["", " ", "\t \n"])
def test_blank_key_is_refused(tmp_path, debug, blank):
    key_file = tmp_path / "key"
    key_file.write_text(blank)

    for env in ({"SECRET_KEY": blank}, {"SECRET_KEY_FILE": str(key_file)}):
        assert "empty or only whitespace" in refused(tmp_path, DEBUG=debug, **env)


def test_manage_py_runs_as_make_run_and_docker_start_it(tmp_path):
    """`make run` exports DEBUG=1 and nothing else; the image and docker-compose.yml give DEBUG=false and a key."""
    for env in ({"DEBUG": "1"}, {"DEBUG": "false", "SECRET_KEY": "from-compose"}):
        result = manage_py(tmp_path, "check", **env)
        assert result.returncode == 0, result.stderr


# --- mail ---


def test_development_prints_mail_on_the_console(tmp_path):
    shown = loaded(tmp_path, DEBUG="1")

    assert shown["EMAIL_BACKEND"] == "django.core.mail.backends.console.EmailBackend"
    assert shown["FC2_EMAIL_ENABLED"] is True


def test_production_without_mail_settings_offers_no_mail(tmp_path):
    assert loaded(tmp_path, SECRET_KEY="k")["FC2_EMAIL_ENABLED"] is False


def test_smtp_from_the_environment(tmp_path):
    password_file = tmp_path / "smtp-password"
    password_file.write_text("s3cret\n")

    shown = loaded(
        tmp_path,
        SECRET_KEY="k",
        EMAIL_HOST="smtp.example.org",
        EMAIL_PORT="2525",
        EMAIL_HOST_USER="fc2",
        EMAIL_HOST_PASSWORD_FILE=str(password_file),
        DEFAULT_FROM_EMAIL="FC² <fc2@example.org>",
    )

    assert shown["EMAIL_BACKEND"] == "django.core.mail.backends.smtp.EmailBackend"
    assert shown["FC2_EMAIL_ENABLED"] is True
    assert (shown["EMAIL_HOST"], shown["EMAIL_PORT"], shown["EMAIL_HOST_USER"]) == ("smtp.example.org", 2525, "fc2")
    assert shown["EMAIL_HOST_PASSWORD"] == "s3cret"
    assert (shown["EMAIL_USE_TLS"], shown["EMAIL_USE_SSL"]) == (True, False)  # STARTTLS unless told otherwise
    assert shown["DEFAULT_FROM_EMAIL"] == "FC² <fc2@example.org>"


def test_smtp_debug_still_uses_smtp(tmp_path):
    """An operator who configured SMTP wants it, even while debugging."""
    shown = loaded(tmp_path, DEBUG="1", EMAIL_HOST="smtp.example.org", EMAIL_HOST_PASSWORD="pw")

    assert shown["EMAIL_BACKEND"] == "django.core.mail.backends.smtp.EmailBackend"


def test_tls_and_ssl_together_are_refused(tmp_path):
    message = refused(tmp_path, SECRET_KEY="k", EMAIL_HOST="smtp.example.org", EMAIL_USE_SSL="true")

    assert "exclusive" in message


# --- password reset ---


def test_with_mail_the_login_page_offers_reset_and_a_link_is_mailed(client, settings, alice):
    settings.FC2_EMAIL_ENABLED = True

    assert reverse("password_reset") in client.get(reverse("login")).content.decode()
    response = client.post(reverse("password_reset"), {"email": alice.email}, follow=True)

    assert response.status_code == 200
    assert "Check your mail" in response.content.decode()
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == [alice.email]
    link = re.search(r"https?://[^/\s]+(/accounts/reset/\S+)", mail.outbox[0].body).group(1)
    form = client.get(link, follow=True)
    assert "Choose a new password" in form.content.decode()
    new_password = {"new_password1": "a-new-password-2", "new_password2": "a-new-password-2"}
    done = client.post(form.redirect_chain[-1][0], new_password, follow=True)
    assert "Password set" in done.content.decode()
    assert client.login(username="alice", password="a-new-password-2")


def test_without_mail_reset_is_not_offered_and_nothing_claims_a_mail_was_sent(client, settings, alice):
    settings.FC2_EMAIL_ENABLED = False

    login = client.get(reverse("login")).content.decode()
    form = client.get(reverse("password_reset"))
    posted = client.post(reverse("password_reset"), {"email": alice.email}, follow=True)
    done = client.get(reverse("password_reset_done"))

    assert reverse("password_reset") not in login
    assert "Ask an administrator" in login
    for response in (form, posted, done):
        page = response.content.decode()
        assert response.status_code == 200
        assert "Ask an administrator" in page
        assert "<form" not in page
        assert "sent" not in page.lower() and "check your mail" not in page.lower()
    assert mail.outbox == []


# --- the API schema ---


def schema(client) -> dict:
    response = client.get(reverse("api-schema"), {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


def test_schema_needs_a_signed_in_user(client, alice):
    assert client.get(reverse("api-schema"), {"format": "json"}).status_code in (401, 403)

    client.force_login(alice)
    assert client.get(reverse("api-schema"), {"format": "json"}).status_code == 200


def test_schema_documents_the_report_api(client, alice):
    client.force_login(alice)
    document = schema(client)

    operation = document["paths"]["/api/v1/jobs/{job_id}/report"]["post"]
    assert operation["security"] == [{"jobToken": []}]
    assert document["components"]["securitySchemes"]["jobToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["jobToken"]["description"],
    }
    bodies = operation["requestBody"]["content"]
    assert set(bodies) == {"application/json", "multipart/form-data"}
    components = document["components"]["schemas"]
    report = components[bodies["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]]
    assert set(report["required"]) == {"node", "status"}
    assert {"progress", "sample", "exit_code", "log_tail"} <= set(report["properties"])
    upload = components[bodies["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[1]]
    assert upload["properties"]["artifact"]["items"] == {"type": "string", "format": "binary"}
    assert {"200", "400", "401", "403", "409", "413"} <= set(operation["responses"])


def test_schema_says_budget_and_max_workers_exclude_each_other(client, alice):
    client.force_login(alice)
    document = schema(client)

    recommend = document["components"]["schemas"]["RecommendInput"]
    assert recommend["not"] == {"required": ["budget", "max_workers"]}
    for method in ("get", "post"):
        assert (
            "budget and max_workers"
            in document["paths"]["/api/v1/recommend"][method]["responses"]["400"]["description"]
        )


def test_schema_is_valid_openapi_without_warnings(tmp_path):
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))


def test_report_api_is_still_the_plain_endpoint_for_agents(job):
    """As before it joined the schema: no CSRF check, no 406 for an odd Accept header, no OPTIONS metadata."""
    client = Client(enforce_csrf_checks=True)
    url = reverse("api-job-report", args=[job.pk])

    response = client.post(url, "{}", content_type="application/json", headers={"Accept": "text/plain"})
    assert (response.status_code, response.json()) == (401, {"error": "missing bearer token"})
    response = client.post(url, "{}", content_type="application/json", headers={"Authorization": "Bearer wrong"})
    assert (response.status_code, response.json()) == (403, {"error": "this token does not belong to this job"})
    assert client.options(url).status_code == 405


# --- the admin ---


class _FormFields(HTMLParser):
    """The fields a browser would post back from the admin's change form, unchanged."""

    def __init__(self):
        super().__init__()
        self.data: dict[str, list[str]] = {}
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        name = attrs.get("name")
        if tag == "input" and name and attrs.get("type") not in ("submit", "button", "file"):
            if attrs.get("type") not in ("checkbox", "radio") or "checked" in attrs:
                self.data.setdefault(name, []).append(attrs.get("value") or "")
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in attrs:
            self.data.setdefault(self._select, []).append(attrs.get("value") or "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = [""]

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea][0] += data.removeprefix("\n") if not self.data[self._textarea][0] else data


def change_form(client, url: str) -> dict[str, list[str]]:
    page = client.get(url)
    assert page.status_code == 200
    parser = _FormFields()
    parser.feed(page.content.decode())
    return parser.data


@pytest.fixture
def staff(django_user_model):
    """A staff member who may view and change jobs, and view what the platform records, but is no superuser."""
    user = django_user_model.objects.create_user("carol", "carol@example.com", "carol-password-1", is_staff=True)
    codenames = ["view_job", "change_job", "view_node", "view_jobevent", "view_artifact", "change_node"]
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="fc2", codename__in=codenames))
    return user


@pytest.fixture(params=["staff", "superuser"])
def admin_user_client(request, client, staff, admin_user):
    client.force_login(staff if request.param == "staff" else admin_user)
    return client


def test_admin_cannot_move_a_job_or_touch_its_token_and_cluster(admin_user_client, job):
    """A job is shown, never edited, even with the right to change jobs: its request stays as it came (its recommend
    step and a re-run read it) and only the pipeline moves its state, token and cluster."""
    client = admin_user_client
    token = job.issue_token()
    job.cluster = {"cluster_id": "fc2-job-x", "nodes": []}
    job.save()
    url = reverse("admin:fc2_job_change", args=[job.pk])
    page = client.get(url)
    forged = {
        "state": Job.State.SUCCEEDED,
        "token_hash": "0" * 64,
        "cluster": '{"cluster_id": "elsewhere", "nodes": []}',
        "failure_reason": "edited",
        "epoch": "7",
        "workers": "3",
        "provider": "aws",
        "request": '{"provider": "aws"}',
    }

    response = client.post(url, forged)

    assert page.status_code == 200 and 'type="submit" value="Save"' not in page.content.decode()
    assert response.status_code == 403
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED
    assert job.token_matches(token)
    assert job.cluster == {"cluster_id": "fc2-job-x", "nodes": []}
    assert (job.failure_reason, job.epoch, job.workers, job.provider) == ("", None, None, "local")
    assert job.request["provider"] == "local"


def test_admin_shows_whether_a_token_is_set_never_the_token(admin_client, job):
    token = job.issue_token()
    job.save()

    page = admin_client.get(reverse("admin:fc2_job_change", args=[job.pk])).content.decode()

    assert "Token set" in page
    assert job.token_hash not in page and token not in page


def test_admin_adds_no_job_behind_the_pipeline(admin_client, db):
    assert admin_client.get(reverse("admin:fc2_job_add")).status_code == 403


@pytest.mark.parametrize("model", [Node, Artifact, JobEvent])
def test_admin_records_are_read_only(admin_user_client, job, model):
    node = Node.objects.create(job=job, name="chief-0", role="chief", index=0, status=Node.Status.RUNNING)
    rows = {
        Node: node,
        Artifact: Artifact.objects.create(job=job, node=node, name="model.keras", file="x/model.keras", size_bytes=1),
        JobEvent: job.events.first(),
    }
    row = rows[model]
    name = model._meta.model_name
    url = reverse(f"admin:fc2_{name}_change", args=[row.pk])
    data = change_form(admin_user_client, url)

    response = admin_user_client.post(url, {**data, "status": "succeeded", "name": "renamed", "message": "edited"})

    assert response.status_code == 403
    assert admin_user_client.get(reverse(f"admin:fc2_{name}_add")).status_code == 403
    fresh = model.objects.get(pk=row.pk)
    assert [getattr(fresh, f.name) for f in model._meta.concrete_fields] == [
        getattr(row, f.name) for f in model._meta.concrete_fields
    ]
