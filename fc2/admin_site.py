"""The Django admin's site: the platform's name on it, and the site's 403 page for a signed-in researcher.

A module of its own, apart from the ModelAdmin registrations in fc2.admin: `admin.site` is built from this class the
first time any app registers a model, so the class must import without registering anything itself.
"""

from __future__ import annotations

from functools import wraps

from django.contrib import admin
from django.contrib.admin.exceptions import DisallowedModelAdminToField
from django.contrib.admin.options import TO_FIELD_VAR
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import HttpRequest, HttpResponse

from fc2.models import is_platform_admin


class PlatformAdminSite(admin.AdminSite):
    """The Django admin under the platform's name, with "View site" back to it. A signed-in researcher gets the
    site's 403 page, as on the dashboard, rather than the admin's login form asking for another account."""

    site_header = "FC² platform admin"
    site_title = "FC² platform admin"
    # The index lists every app's models (accounts, jobs and uploads, instance catalogues, performance records, the
    # monitor's samples), not records alone.
    index_title = "Site administration"
    site_url = "/"

    def admin_view(self, view, cacheable=False):
        """Every admin view, refusing (400) what Django's admin would answer with a 500: an empty `?_to_field=`,
        which its change form looks up as a field's name (a field it does not allow is a 400), and NUL in a query
        value, which its lists put in their queries as it comes (PostgreSQL refuses NUL in text)."""
        inner = super().admin_view(view, cacheable)

        @wraps(inner)
        def checked(request: HttpRequest, *args, **kwargs):
            if request.GET.get(TO_FIELD_VAR) == "" or request.POST.get(TO_FIELD_VAR) == "":
                raise DisallowedModelAdminToField("the field _to_field names is empty")
            if any("\x00" in text for name, values in request.GET.lists() for text in (name, *values)):
                raise BadRequest("a query string that holds NUL")
            return inner(request, *args, **kwargs)

        return checked

    def login(self, request: HttpRequest, extra_context=None) -> HttpResponse:
        if request.user.is_authenticated and request.user.is_active and not is_platform_admin(request.user):
            raise PermissionDenied("The admin is for platform admins.")
        return super().login(request, extra_context)
