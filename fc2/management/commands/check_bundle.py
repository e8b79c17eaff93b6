"""`manage.py check_bundle PATH [--main SCRIPT] [--json]`: check a wheel the way the upload form does."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from django.core.management.base import CommandParser

from fc2.bundles import BundleError, WheelInfo, validate_wheel
from recommender.management.base import ContractCommand


class Command(ContractCommand):
    help = "Check a wheel bundle as the upload form would: print `ok`, or `error: <reason>` on stderr and exit 1."
    # Judging a file needs neither the database nor the rest of the site.
    requires_system_checks = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="the wheel file")
        parser.add_argument(
            "--main",
            default="main.py",
            metavar="SCRIPT",
            help="the main script: a file name found anywhere in the wheel, or its full path (default: main.py)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = options["json"]
        try:
            info = check_path(Path(options["path"]), options["main"])
        except BundleError as exc:
            self.fail(str(exc), as_json)
        self.stdout.write(json.dumps({"ok": True, **asdict(info)}) if as_json else "ok")


def check_path(path: Path, main_script: str) -> WheelInfo:
    """Validate the wheel at `path`, turning a file that cannot be opened into a BundleError too."""
    try:
        with path.open("rb") as fileobj:
            return validate_wheel(fileobj, path.name, main_script)
    except FileNotFoundError:
        raise BundleError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise BundleError(f"{path} is a directory, not a wheel") from None
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc.strerror or exc}") from None
