"""The user's account: sign-in pages that depend on mail, and the personal API tokens page (/account/tokens/).

Password reset is offered only where a reset link can be delivered. Without a mail backend (production with no
EMAIL_HOST) the pages that start a reset answer with "ask an administrator" instead of a form that would claim a mail
was sent. The confirm and complete pages stay as Django has them: they only act on a valid signed link, which only a
mail could have carried.

The tokens page makes a token and shows its secret once, in the answer to the POST that made it (never again: only its
hash is kept), lists the user's tokens without their secrets, and revokes one.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from fc2.models import ApiToken
from fc2.services import tokens


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
    """The user's API tokens; POST makes one and shows its secret, this once."""
    form = TokenForm(request.POST or None)
    secret, status = None, 200
    if form.is_bound:
        if form.is_valid():
            try:
                token, secret = tokens.create(
                    request.user, form.cleaned_data["name"], form.cleaned_data["expires_days"]
                )
            except tokens.TokenError as exc:
                form.add_error("name", str(exc))
            else:
                form = TokenForm()
        if secret is None:
            status = 400
    context = {"form": form, "secret": secret, "tokens": ApiToken.objects.filter(user=request.user)}
    response = render(request, "fc2/account_tokens.html", context, status=status)
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
