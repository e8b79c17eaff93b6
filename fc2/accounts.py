"""The user's account: sign-in pages that depend on mail, and the personal API tokens page (/account/tokens/).

Password reset is offered only where a reset link can be delivered. Without a mail backend (production with no
EMAIL_HOST) the pages that start a reset answer with "ask an administrator" instead of a form that would claim a mail
was sent. The confirm and complete pages stay as Django has them: they only act on a valid signed link, which only a
mail could have carried.

Every signed-in request loads its user by primary key; `UserBackend` does it with one prepared query instead of building
the ORM's, which cost several times the query itself.

The tokens page makes a token and shows its secret once, in the answer to the POST that made it (never again: only its
hash is kept), lists the user's tokens without their secrets, and revokes one.
"""

from __future__ import annotations

import functools

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth import views as auth_views
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db import connections, router
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from fc2.models import ApiToken
from fc2.services import tokens


class UserBackend(ModelBackend):
    """Django's ModelBackend (passwords, permissions, is_active), with the user of a session read by `load_user`.

    settings.AUTHENTICATION_BACKENDS lists ModelBackend after it only for the sessions signed in before this backend
    existed, which name ModelBackend: a refused sign-in stops here, so a wrong password is never hashed twice."""

    def authenticate(self, request, username=None, password=None, **kwargs) -> AbstractBaseUser | None:
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            raise PermissionDenied  # the sign-in fails, as it would have; no other backend checks it again
        return user

    def get_user(self, user_id) -> AbstractBaseUser | None:
        user = load_user(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None


def load_user(pk) -> AbstractBaseUser | None:
    """The user with this primary key, read from the database every time (a password changed or an account
    deactivated counts at once) as `User.objects.get(pk=pk)` reads it — the same columns, each through the same
    converters — but in a query written once per database rather than compiled by the ORM on every request; None
    when there is none."""
    model = get_user_model()
    connection = connections[router.db_for_read(model)]
    sql, attnames, converters = _user_query(model, connection.alias)
    with connection.cursor() as cursor:
        cursor.execute(sql, [model._meta.pk.get_db_prep_value(pk, connection)])
        row = cursor.fetchone()
    if row is None:
        return None
    values = list(row)
    for index, column, functions in converters:
        for function in functions:
            values[index] = function(values[index], column, connection)
    return model.from_db(connection.alias, attnames, values)


@functools.cache
def _user_query(model: type[AbstractBaseUser], alias: str) -> tuple[str, list[str], list[tuple]]:
    """`load_user`'s query on one database: its SQL, the attributes its columns fill, and each column's converters
    (index, column, functions) as the ORM applies them."""
    connection = connections[alias]
    meta = model._meta
    fields = meta.concrete_fields
    quote = connection.ops.quote_name
    sql = (
        f"SELECT {', '.join(quote(field.column) for field in fields)} FROM {quote(meta.db_table)} "
        f"WHERE {quote(meta.pk.column)} = %s"
    )
    converters = []
    for index, field in enumerate(fields):
        column = field.get_col(meta.db_table)
        functions = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
        if functions:
            converters.append((index, column, functions))
    return sql, [field.attname for field in fields], converters


class LoginView(auth_views.LoginView):
    def get_context_data(self, **kwargs):
        return super().get_context_data(password_reset=settings.FC2_EMAIL_ENABLED, **kwargs)


class _NeedsMail:
    def dispatch(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not settings.FC2_EMAIL_ENABLED:
            return render(request, "registration/password_reset_unavailable.html")
        return super().dispatch(request, *args, **kwargs)


class PasswordResetView(_NeedsMail, auth_views.PasswordResetView):
    pass


class PasswordResetDoneView(_NeedsMail, auth_views.PasswordResetDoneView):
    pass


# The session key under which a new token's secret waits for the page the POST redirects to (read once).
NEW_TOKEN_KEY = "fc2_new_token_secret"


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=ApiToken._meta.get_field("name").max_length,
        help_text="What will use it, e.g. “laptop” or “nightly sweep”.",
    )
    expires_days = forms.TypedChoiceField(
        label="Expires",
        choices=[("", "Never"), (7, "In 7 days"), (30, "In 30 days"), (90, "In 90 days"), (365, "In a year")],
        coerce=int,
        empty_value=None,
        required=False,
    )


@login_required
@require_http_methods(["GET", "POST"])
def tokens_page(request: HttpRequest) -> HttpResponse:
    """The user's API tokens. POST makes one and redirects (post/redirect/get: reloading the page makes no second
    token); the page after the redirect shows the new token's secret, this once, from the session."""
    form = TokenForm(request.POST or None)
    if form.is_bound and form.is_valid():
        try:
            _token, secret = tokens.create(request.user, form.cleaned_data["name"], form.cleaned_data["expires_days"])
        except tokens.TokenError as exc:
            form.add_error("name", str(exc))
        else:
            request.session[NEW_TOKEN_KEY] = secret
            return redirect("account-tokens")
    secret = request.session.pop(NEW_TOKEN_KEY, None) if not form.is_bound else None
    context = {"form": form, "secret": secret, "tokens": ApiToken.objects.filter(user=request.user)}
    response = render(request, "fc2/account_tokens.html", context, status=400 if form.is_bound else 200)
    if secret:
        response["Cache-Control"] = "no-store"  # the secret must not outlive this page in any cache
    return response


@login_required
@require_POST
def revoke_token(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    if token.revoke():
        messages.success(request, f"Token “{token.name}” revoked: requests with it are refused from now on.")
    return redirect("account-tokens")
