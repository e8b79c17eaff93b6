"""Personal API tokens on the wire: `Authorization: Token <secret>` (or `Bearer <secret>`) on every API endpoint but
the node agents' reports, which carry a job's own token (fc2/api.py).

Cheap by design, since every API request pays for it: one indexed query (the SHA-256 of the secret, which is 32 random
bytes, so no password hasher is needed), its result kept on the request so that the upload limits (fc2/uploads.py),
which look before the view does, and the view share it; and a write of the token's last use at most once a minute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.http import HttpRequest
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed

from fc2.models import ApiToken

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from drf_spectacular.openapi import AutoSchema
    from rest_framework.request import Request

SCHEMES = ("token", "bearer")
_ON_REQUEST = "_fc2_api_token"


def presented_secret(request: HttpRequest) -> str | None:
    """The secret after `Token ` or `Bearer ` in the Authorization header ("" for the scheme alone); None when the
    request presents no token."""
    scheme, _, secret = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return secret.strip() if scheme.lower() in SCHEMES else None


def authenticate(request: HttpRequest) -> tuple[ApiToken | None, str]:
    """The request's token and "", or None and why it is refused — looked up once per request."""
    found = getattr(request, _ON_REQUEST, None)
    if found is None:
        found = _look_up(presented_secret(request))
        setattr(request, _ON_REQUEST, found)
    return found


def _look_up(secret: str | None) -> tuple[ApiToken | None, str]:
    if secret is None:
        return None, "no API token"
    if not secret:
        return None, "no API token after the scheme: send `Authorization: Token <token>`"
    token = ApiToken.objects.find(secret)
    if token is None:
        return None, "invalid API token"
    if refusal := token.refusal():
        return None, refusal
    token.touch()
    return token, ""


class ApiTokenAuthentication(BaseAuthentication):
    """DRF's view of it: the token's user, with the token as `request.auth` (what the submit throttle counts by)."""

    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        if presented_secret(request._request) is None:
            return None  # perhaps the browser's session
        token, refusal = authenticate(request._request)
        if token is None:
            raise AuthenticationFailed(refusal)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        # Named in the 401's WWW-Authenticate; also what makes DRF answer 401 rather than 403 without credentials.
        return 'Token realm="api"'


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = ApiTokenAuthentication
    name = "apiToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <token>` (or `Bearer <token>`): a personal API token from /account/tokens/ or "
            "`manage.py api_token create USER --name NAME`.",
        }
