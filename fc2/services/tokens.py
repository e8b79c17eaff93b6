"""Personal API tokens: making one (its secret shown once), revoking it, and what may be shown of it — never its
secret, which is not kept (fc2.models.ApiToken keeps its SHA-256). The settings page (/account/tokens/) and
`manage.py api_token` both come here."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from common.columns import max_length
from fc2.models import ApiToken

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# Longest life a token may be given, in days (a token that should never expire is given none).
MAX_EXPIRY_DAYS = 3650


class TokenError(ValueError):
    """The token cannot be made as asked; the message says why."""


def create(user: User, name: str, expires_days: int | None = None) -> tuple[ApiToken, str]:
    """A new token for `user` named `name` and its secret, to show once; `expires_days` from now, or never."""
    name = name.strip()
    longest = max_length(ApiToken, "name")
    if not name:
        raise TokenError("a token needs a name (e.g. the machine or script that will use it)")
    if len(name) > longest:
        raise TokenError(f"a token's name has at most {longest} characters")
    if expires_days is not None and not 1 <= expires_days <= MAX_EXPIRY_DAYS:
        raise TokenError(f"a token expires after 1 to {MAX_EXPIRY_DAYS} days (or give no expiry)")
    now = timezone.now()
    expires_at = now + timedelta(days=expires_days) if expires_days is not None else None
    try:
        with transaction.atomic():
            # The user's tokens are counted and made one request at a time (PostgreSQL: the row's lock).
            get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
            live = ApiToken.objects.filter(Q(expires_at=None) | Q(expires_at__gt=now), user=user, revoked_at=None)
            if (count := live.count()) >= (limit := settings.FC2_MAX_API_TOKENS_PER_USER):
                raise TokenError(
                    f"{user} has {count} live API tokens, the most one user may have ({limit}): revoke one first"
                )
            return ApiToken.issue(user, name, expires_at)
    except IntegrityError:  # unique_live_token_name
        raise TokenError(
            f"{user} already has a token named {name!r}: revoke it first, or choose another name"
        ) from None


def describe(token: ApiToken) -> dict:
    """What may be shown of a token: everything but its secret (which is not kept) and the secret's hash."""

    def moment(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "status": token.status,
        "created_at": moment(token.created_at),
        "last_used_at": moment(token.last_used_at),
        "expires_at": moment(token.expires_at),
        "revoked_at": moment(token.revoked_at),
    }
