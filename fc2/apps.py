"""The platform's app configs: fc2 itself, and the Django admin under the platform's name (`PlatformAdminSite`)."""

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps
from django.db.models.signals import post_migrate


class Fc2Config(AppConfig):
    name = "fc2"
    verbose_name = "FC² platform"

    def ready(self) -> None:
        from fc2 import checks  # noqa: F401 - registers the system checks

        post_migrate.connect(_triggers_back, sender=self)


TRIGGERS_MIGRATION = ("fc2", "0014_answer_checks_triggers")


def _triggers_back(using: str, **kwargs) -> None:
    """After a `migrate` (or a flush), the answer cache's triggers that a later migration lost are made again (SQLite
    rebuilds a table to alter it, and drops its triggers with it) — where their migration is applied and every table
    they watch is there (a router may keep them on another database)."""
    from django.db import connections
    from django.db.migrations.recorder import MigrationRecorder

    from fc2 import answer_triggers

    connection = connections[using]
    if (
        connection.vendor in answer_triggers.VENDORS
        and TRIGGERS_MIGRATION in MigrationRecorder(connection).applied_migrations()
    ):
        answer_triggers.ensure(connection)


class PlatformAdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin with `fc2.admin_site.PlatformAdminSite` as its site (named in INSTALLED_APPS)."""

    default = False  # Fc2Config stays the config of the "fc2" entry
    default_site = "fc2.admin_site.PlatformAdminSite"
