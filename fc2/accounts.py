"""Sign-in pages that depend on mail: password reset is offered only where a reset link can be delivered.

Without a mail backend (production with no EMAIL_HOST) the pages that start a reset answer with "ask an administrator"
instead of a form that would claim a mail was sent. The confirm and complete pages stay as Django has them: they only
act on a valid signed link, which only a mail could have carried.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


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
