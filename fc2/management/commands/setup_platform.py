"""`manage.py setup_platform`: what a fresh installation needs after `migrate` (idempotent).

Loads the bundled instance catalogues and the sample performance records (recommender/data/samples.toml: Anwar's
Table 4 as workload `anwar2021-mnist`, and any sample grid listed beside it), registers and materialises the built-in
datasets that need no download, and creates the two demo accounts (an admin and a researcher) the first time. Their
passwords go to a file only its owner can read (`var/demo-passwords.txt`), not to the terminal, where the server's
output would scroll them away: the command prints where the file is, and so does `make run` right before it starts the
servers.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from fc2.services import datasets
from recommender.catalog import bundled_catalogs, load_catalog
from recommender.perfdata import import_samples

DEMO_ACCOUNTS = (("admin", True), ("researcher", False))
PASSWORDS_HEADER = "# FC² demo accounts: username and password. Change one with `manage.py changepassword USERNAME`.\n"


def passwords_file() -> Path:
    return settings.VAR_DIR / "demo-passwords.txt"


def save_passwords(path: Path, passwords: dict[str, str]) -> None:
    """Write `username password` lines to `path` (mode 0600), keeping the lines of accounts not in `passwords`."""
    kept: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            username, _, password = line.partition(" ")
            if username and not username.startswith("#"):
                kept[username] = password
    kept.update(passwords)
    partial = path.with_name(path.name + ".new")
    partial.unlink(missing_ok=True)
    # Created with mode 0600, so the passwords are never readable by others, not even for a moment.
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
        out.write(PASSWORDS_HEADER + "".join(f"{username} {password}\n" for username, password in kept.items()))
    partial.replace(path)


class Command(BaseCommand):
    help = (
        "Load catalogues, sample performance records and built-in datasets; create the demo admin and researcher "
        "accounts once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--no-demo-accounts", action="store_true", help="do not create the demo admin and researcher accounts"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for name in bundled_catalogs():
            catalog = load_catalog(name)
            self.stdout.write(f"catalogue {catalog.name}: {catalog.types.count()} instance types")
        for result in import_samples():
            strategies = ", ".join(s for s in result.strategies if s)
            what = f"{', '.join(result.workloads)} ({strategies})" if strategies else ", ".join(result.workloads)
            self.stdout.write(f"performance records {what} from {result.file}: {result.imported} records")
        datasets.materialise_builtin("digits")  # ships with scikit-learn; mnist/cifar10 download on first use
        for dataset in datasets.ensure_builtin_rows():
            self.stdout.write(f"dataset {dataset.name}: {'ready' if dataset.path else 'downloaded on first use'}")
        if not options["no_demo_accounts"]:
            self._demo_accounts()

    def _demo_accounts(self) -> None:
        User = get_user_model()
        created = {}
        for username, is_admin in DEMO_ACCOUNTS:
            if User.objects.filter(username=username).exists():
                continue
            created[username] = secrets.token_urlsafe(9)
            User.objects.create_user(
                username, f"{username}@example.com", created[username], is_staff=is_admin, is_superuser=is_admin
            )
        if created:
            path = passwords_file()
            save_passwords(path, created)
            self.stdout.write(
                self.style.SUCCESS(f"created demo accounts {', '.join(created)}; their passwords are in {path}")
            )
