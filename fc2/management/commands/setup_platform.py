"""`manage.py setup_platform`: what a fresh installation needs after `migrate` (idempotent).

Loads the bundled instance catalogues and the sample performance records (recommender/data/samples.toml: Anwar's
Table 4 as workload `anwar2021-mnist`, and any sample grid listed beside it), registers and materialises the built-in
datasets that need no download, and creates the two demo accounts (an admin and a researcher) the first time,
printing their passwords once.
"""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from fc2.services import datasets
from recommender.catalog import bundled_catalogs, load_catalog
from recommender.perfdata import import_samples

DEMO_ACCOUNTS = (("admin", True), ("researcher", False))


class Command(BaseCommand):
    help = (
        "Load catalogues, sample performance records and built-in datasets; create the demo admin and researcher "
        "accounts once."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--no-demo-accounts", action="store_true", help="do not create the demo admin and researcher accounts"
        )

    def handle(self, *args, **options):
        for name in bundled_catalogs():
            catalog = load_catalog(name)
            self.stdout.write(f"catalogue {catalog.name}: {catalog.types.count()} instance types")
        for result in import_samples():
            self.stdout.write(f"performance records {', '.join(result.workloads)}: {result.imported} records")
        datasets.materialise_builtin("digits")  # ships with scikit-learn; mnist/cifar10 download on first use
        for dataset in datasets.ensure_builtin_rows():
            self.stdout.write(f"dataset {dataset.name}: {'ready' if dataset.path else 'downloaded on first use'}")
        if not options["no_demo_accounts"]:
            self._demo_accounts()

    def _demo_accounts(self):
        User = get_user_model()
        for username, is_admin in DEMO_ACCOUNTS:
            if User.objects.filter(username=username).exists():
                continue
            password = secrets.token_urlsafe(9)
            User.objects.create_user(
                username, f"{username}@example.com", password, is_staff=is_admin, is_superuser=is_admin
            )
            role = "admin" if is_admin else "researcher"
            self.stdout.write(self.style.SUCCESS(f"created {role} account: {username} / {password}  (shown once)"))
