"""The platform's app configs: fc2 itself, and the Django admin under the platform's name (`PlatformAdminSite`)."""

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class Fc2Config(AppConfig):
    name = "fc2"
    verbose_name = "FC² platform"

    def ready(self) -> None:
        from fc2 import checks  # noqa: F401 - registers the system checks


class PlatformAdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin with `fc2.admin_site.PlatformAdminSite` as its site (named in INSTALLED_APPS)."""

    default = False  # Fc2Config stays the config of the "fc2" entry
    default_site = "fc2.admin_site.PlatformAdminSite"
