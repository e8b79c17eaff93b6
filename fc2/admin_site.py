"""The Django admin's site: the platform's name on it, and the site's 403 page for a signed-in researcher.

A module of its own, apart from the ModelAdmin registrations in fc2.admin: `admin.site` is built from this class the
first time any app registers a model, so the class must import without registering anything itself.
"""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from fc2.models import is_platform_admin


class PlatformAdminSite(admin.AdminSite):
    """The Django admin under the platform's name, with "View site" back to it. A signed-in researcher gets the
    site's 403 page, as on the dashboard, rather than the admin's login form asking for another account."""

    site_header = "FC² platform admin"
    site_title = "FC² platform admin"
    index_title = "Records"
    site_url = "/"

    def login(self, request: HttpRequest, extra_context=None) -> HttpResponse:
        if request.user.is_authenticated and request.user.is_active and not is_platform_admin(request.user):
            raise PermissionDenied("The admin is for platform admins.")
        return super().login(request, extra_context)
