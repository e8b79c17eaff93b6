"""Personal API tokens: made on the settings page and by `manage.py api_token`, shown once, kept as a hash, refused
once revoked or expired, the last use written at most once a minute; HTTP Basic refused; admins see the metadata."""

from __future__ import annotations

import base64
import hashlib
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from fc2.models import ApiToken
from fc2.services import tokens
from tests.conftest import call_json


def me(client, authorization: str | None):
    headers = {"Authorization": authorization} if authorization is not None else {}
    return client.get(reverse("api-me"), headers=headers)


@pytest.fixture
def secret(alice) -> str:
    return tokens.create(alice, "laptop")[1]


def test_a_token_is_recognisable_and_only_its_hash_is_kept(alice, secret):
    token = ApiToken.objects.get(user=alice)

    assert secret.startswith("fc2_") and len(secret) > 40
    assert token.token_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert token.prefix == secret[:12]
    stored = " ".join(str(value) for value in ApiToken.objects.filter(pk=token.pk).values().first().values())
    assert secret not in stored


@pytest.mark.parametrize("scheme", ["Token", "Bearer", "token", "bearer"])
def test_token_or_bearer_authenticates_as_its_user(client, alice, secret, scheme):
    response = me(client, f"{scheme} {secret}")

    assert response.status_code == 200
    assert response.json() == {"username": "alice", "is_admin": False}


def test_the_recommender_takes_a_token_too(client, alice, secret):
    response = client.post(
        reverse("api-recommend"), {"algorithm": "nothing"}, content_type="application/json",
        headers={"Authorization": f"Bearer {secret}"},
    )  # fmt: skip

    assert response.status_code == 400 and "algorithm" in response.json()["fields"]


def test_authentication_is_one_query(client, alice, secret, django_assert_num_queries):
    me(client, f"Token {secret}")  # the first use of the minute writes last_used_at

    with django_assert_num_queries(1):
        assert me(client, f"Token {secret}").status_code == 200


def refused(response, reason: str) -> None:
    assert response.status_code == 401
    assert response.json() == {"error": reason}
    assert response["WWW-Authenticate"] == 'Token realm="api"'


def test_revoked_token_is_401(client, alice, secret):
    ApiToken.objects.get(user=alice).revoke()

    refused(me(client, f"Token {secret}"), "this API token is revoked")


def test_expired_token_is_401(client, alice):
    token, secret = tokens.create(alice, "short", expires_days=1)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    refused(me(client, f"Token {secret}"), "this API token is expired")


def test_token_of_an_inactive_user_is_401(client, alice, secret):
    alice.is_active = False
    alice.save()

    refused(me(client, f"Token {secret}"), "this API token's user is inactive")


@pytest.mark.parametrize(
    ("authorization", "reason"),
    [
        ("Token fc2_not-a-token", "invalid API token"),
        ("Bearer somebody-elses-job-token", "invalid API token"),
        ("Token", "no API token after the scheme: send `Authorization: Token <token>`"),
        (None, "Authentication credentials were not provided."),
    ],
)
def test_unknown_or_missing_token_is_401(client, db, authorization, reason):
    refused(me(client, authorization), reason)


def test_basic_authentication_is_refused(client, alice):
    credentials = base64.b64encode(b"alice:alice-password-1").decode()

    refused(me(client, f"Basic {credentials}"), "Authentication credentials were not provided.")


def test_the_session_still_works_for_the_browser(client, alice):
    client.force_login(alice)

    assert me(client, None).json()["username"] == "alice"


def test_last_use_is_written_at_most_once_a_minute(client, alice, secret):
    token = ApiToken.objects.get(user=alice)
    assert token.last_used_at is None

    me(client, f"Token {secret}")
    token.refresh_from_db()
    first = token.last_used_at
    me(client, f"Token {secret}")
    token.refresh_from_db()

    assert first is not None and token.last_used_at == first
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(seconds=61))
    me(client, f"Token {secret}")
    token.refresh_from_db()
    assert token.last_used_at > first


# --- the settings page ------------------------------------------------------------------------------------------------


def test_settings_page_shows_a_new_token_once(client, alice):
    """Post/redirect/get: the secret is shown on the page the POST redirects to, once; reloading it shows the secret
    no more and makes no second token."""
    client.force_login(alice)

    made = client.post(reverse("account-tokens"), {"name": "notebook", "expires_days": "30"}, follow=True)

    assert made.redirect_chain == [(reverse("account-tokens"), 302)]
    token = ApiToken.objects.get(user=alice, name="notebook")
    secret = made.context["secret"]
    assert secret in made.content.decode() and made["Cache-Control"] == "no-store"
    assert me(client, f"Token {secret}").json()["username"] == "alice"
    assert timedelta(days=29) < token.expires_at - timezone.now() <= timedelta(days=30)
    again = client.get(reverse("account-tokens")).content.decode()
    assert secret not in again and token.prefix in again and "notebook" in again
    assert ApiToken.objects.filter(user=alice).count() == 1


def test_settings_page_is_linked_from_the_nav(client, alice):
    client.force_login(alice)

    assert reverse("account-tokens") in client.get(reverse("home")).content.decode()


def test_settings_page_refuses_a_name_in_use(client, alice, secret):
    client.force_login(alice)

    response = client.post(reverse("account-tokens"), {"name": "laptop"})

    assert response.status_code == 400
    assert "already has a token named" in response.content.decode()
    assert ApiToken.objects.filter(user=alice).count() == 1


def test_settings_page_revokes_and_only_ones_own(client, alice, bob, secret):
    token = ApiToken.objects.get(user=alice)
    client.force_login(bob)
    assert client.post(reverse("account-token-revoke", args=[token.pk])).status_code == 404
    client.force_login(alice)

    response = client.post(reverse("account-token-revoke", args=[token.pk]))

    assert response.status_code == 302
    token.refresh_from_db()
    assert token.status == "revoked"
    assert me(client, f"Token {secret}").status_code == 401


def test_settings_page_needs_a_login(client, db):
    assert client.get(reverse("account-tokens")).status_code == 302


def test_a_user_has_a_bounded_number_of_live_tokens(client, alice, bob, settings):
    """At every door: the settings page, `manage.py api_token create`, the service both call. A revoked or expired
    token does not count."""
    settings.FC2_MAX_API_TOKENS_PER_USER = 3
    made = [tokens.create(alice, f"t{i}")[0] for i in range(3)]
    reason = "alice has 3 live API tokens, the most one user may have (3): revoke one first"

    with pytest.raises(tokens.TokenError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        tokens.create(alice, "one more")
    code, out, _ = call_json("api_token", "create", "alice", "--name", "one more")
    assert code == 1 and out["error"] == reason
    client.force_login(alice)
    page = client.post(reverse("account-tokens"), {"name": "one more"})
    assert page.status_code == 400 and "revoke one first" in page.content.decode()
    assert tokens.create(bob, "bobs")  # each user's own bound

    made[0].revoke()
    tokens.create(alice, "after a revoke")
    ApiToken.objects.filter(pk=made[1].pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    tokens.create(alice, "after an expiry")
    assert ApiToken.objects.filter(user=alice).count() == 5


# --- manage.py api_token ---------------------------------------------------------------------------------------------


def test_command_creates_lists_and_revokes(client, alice):
    code, made, _ = call_json("api_token", "create", "alice", "--name", "ci", "--expires-days", "7")
    assert code == 0 and made["token"].startswith("fc2_") and made["status"] == "active"
    assert me(client, f"Token {made['token']}").status_code == 200

    code, listed, _ = call_json("api_token", "list", "alice")
    assert code == 0 and [t["name"] for t in listed["tokens"]] == ["ci"]
    assert made["token"] not in str(listed) and "token_hash" not in str(listed)
    assert set(listed["tokens"][0]) == {
        "id", "name", "prefix", "status", "created_at", "last_used_at", "expires_at", "revoked_at"
    }  # fmt: skip

    code, revoked, _ = call_json("api_token", "revoke", "alice", "--name", "ci")
    assert code == 0 and revoked["status"] == "revoked"
    assert me(client, f"Token {made['token']}").status_code == 401


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["create", "nobody", "--name", "x"], "no user 'nobody'"),
        (["create", "alice", "--name", "   "], "a token needs a name (e.g. the machine or script that will use it)"),
        (["create", "alice", "--name", "x", "--expires-days", "0"], "a token expires after 1 to 3650 days"),
        (["revoke", "alice", "--name", "nothing"], "alice has no live token with name 'nothing'"),
        (["revoke", "alice", "--id", "999"], "alice has no token with id 999"),
    ],
)
def test_command_errors_keep_the_contract(alice, capsys, args, reason):
    code, out, err = call_json("api_token", *args)

    assert code == 1
    assert out["ok"] is False and out["error"].startswith(reason)
    assert err.startswith(f"error: {reason}")


def test_command_refuses_a_second_live_token_of_a_name_and_a_second_revoke(alice, secret):
    code, out, _ = call_json("api_token", "create", "alice", "--name", "laptop")
    assert code == 1 and "already has a token named 'laptop'" in out["error"]

    assert call_json("api_token", "revoke", "alice", "--name", "laptop")[0] == 0
    code, out, _ = call_json("api_token", "revoke", "alice", "--id", str(ApiToken.objects.get().pk))
    assert code == 1 and "already revoked" in out["error"]
    # Revoked, its name is free again.
    assert call_json("api_token", "create", "alice", "--name", "laptop")[0] == 0


def test_command_without_json_prints_the_secret_alone(alice, capsys):
    call_command("api_token", "create", "alice", "--name", "plain")

    out = capsys.readouterr().out.strip()
    assert out.startswith("fc2_") and ApiToken.objects.get().token_hash == hashlib.sha256(out.encode()).hexdigest()


# --- the admin -------------------------------------------------------------------------------------------------------


def test_admin_sees_every_users_tokens_but_no_secret(client, alice, bob, django_user_model):
    mine, alice_secret = tokens.create(alice, "alice-laptop")
    theirs, bob_secret = tokens.create(bob, "bob-ci")
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "root-password-1")
    client.force_login(admin)

    listing = client.get(reverse("admin:fc2_apitoken_changelist")).content.decode()
    page = client.get(reverse("admin:fc2_apitoken_change", args=[mine.pk])).content.decode()

    for token in (mine, theirs):
        assert token.name in listing and token.prefix in listing
    for text in (listing, page):
        assert alice_secret not in text and bob_secret not in text
        assert mine.token_hash not in text and theirs.token_hash not in text


def test_admin_revokes_with_the_action(client, alice, django_user_model, secret):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "root-password-1")
    client.force_login(admin)
    token = ApiToken.objects.get(user=alice)

    client.post(reverse("admin:fc2_apitoken_changelist"), {"action": "revoke", "_selected_action": [token.pk]})

    token.refresh_from_db()
    assert token.status == "revoked"
