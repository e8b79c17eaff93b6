"""What every command of DESIGN.md's command-line contract shares: how it fails."""

from __future__ import annotations

import json
import sys
from typing import NoReturn

from django.core.management.base import BaseCommand


class ContractCommand(BaseCommand):
    """A command whose errors are `error: <reason>` on stderr and exit 1 (with --json, also one JSON object on stdout).

    Not CommandError: Django would print "CommandError: …", and the contract says "error: …".
    """

    def fail(self, reason: str, as_json: bool, details: tuple[str, ...] = (), **extra) -> NoReturn:
        if as_json:
            self.stdout.write(json.dumps({"ok": False, "error": reason, **extra}))
        self.stderr.write(f"error: {reason}")
        for line in details:
            self.stderr.write(f"  {line}")
        sys.exit(1)
