"""`manage.py api_token create|list|revoke USER`: a user's personal API tokens (docs/API.md), as /account/tokens/.

api_token create USER --name NAME [--expires-days N] [--json]   the secret, printed this once
api_token list USER [--json]                                    metadata only: never a secret (none is kept)
api_token revoke USER (--name NAME | --id ID) [--json]
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandParser

from fc2.models import ApiToken
from fc2.services import tokens
from recommender.management.base import ContractCommand

if TYPE_CHECKING:
    from django.contrib.auth.models import User


class Command(ContractCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, help="what to do (each has its own --help)")

        create = actions.add_parser("create", help="make a token and print its secret, this once")
        create.add_argument("--name", required=True, help="what will use it, e.g. the machine or script")
        create.add_argument(
            "--expires-days", type=int, metavar="N", help=f"it expires N days from now (1–{tokens.MAX_EXPIRY_DAYS})"
        )
        listing = actions.add_parser("list", help="the user's tokens: names, prefixes, status and times")
        revoke = actions.add_parser("revoke", help="revoke a token for good")
        which = revoke.add_mutually_exclusive_group(required=True)
        which.add_argument("--name", help="the live token of that name")
        which.add_argument("--id", type=int, help="the token of that id (`list` shows it)")

        for sub in (create, listing, revoke):
            sub.add_argument("user", metavar="USER", help="the username")
            sub.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, action: str, user: str, **options: Any) -> None:
        as_json = options["json"]
        owner = get_user_model().objects.filter(username=user).first()
        if owner is None:
            self.fail(f"no user {user!r}", as_json)
        out, text = getattr(self, f"_{action}")(owner, as_json, **options)
        self.stdout.write(json.dumps(out) if as_json else text)

    def _create(self, owner: User, as_json: bool, name: str, expires_days: int | None, **_: object) -> tuple[dict, str]:
        try:
            token, secret = tokens.create(owner, name, expires_days)
        except tokens.TokenError as exc:
            self.fail(str(exc), as_json)
        if not as_json:
            self.stderr.write(f"token {token.name!r} for {owner}: shown this once, only its hash is kept")
        return {"ok": True, "token": secret, **tokens.describe(token)}, secret

    def _list(self, owner: User, as_json: bool, **_: object) -> tuple[dict, str]:
        found = [tokens.describe(token) for token in ApiToken.objects.filter(user=owner)]
        lines = [
            f"{t['id']:>5}  {t['prefix']}…  {t['status']:<8} {t['name']}  last used {t['last_used_at'] or 'never'}"
            for t in found
        ]
        return {"ok": True, "user": owner.get_username(), "tokens": found}, "\n".join(lines) or f"{owner} has no tokens"

    def _revoke(self, owner: User, as_json: bool, name: str | None, id: int | None, **_: object) -> tuple[dict, str]:
        live = ApiToken.objects.filter(user=owner)
        token = live.filter(pk=id).first() if id is not None else live.filter(name=name, revoked_at=None).first()
        if token is None:
            which = f"id {id}" if id is not None else f"name {name!r}"
            self.fail(f"{owner} has no {'live ' if id is None else ''}token with {which}", as_json)
        if not token.revoke():
            self.fail(f"token {token.name!r} (id {token.pk}) was already revoked", as_json)
        return {"ok": True, **tokens.describe(token)}, f"revoked {token.name!r} ({token.prefix}…)"
