"""What every command of DESIGN.md's command-line contract shares: how it fails.

With `--json`, every outcome is exactly one JSON object on stdout — errors too (`{"ok": false, "error": …}` and a
non-zero exit), including the ones argparse finds before the command runs (a missing option, a bad choice or number).

It lives with the recommender, the app every other one may depend on, so that the recommender's commands depend on
nothing of the platform's (fc2's commands use it from here).
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError, ProgrammingError

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def user_named(username: str | None) -> User | None:
    """The user a command acts for (`--user`, `--owner`), or None when not named; a CommandError when there is none
    of that name (the command's `error: …`)."""
    if username is None:
        return None
    from django.contrib.auth import get_user_model  # (the app registry is ready only once a command runs)

    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no user named {username!r}")
    return user


class ContractParser(CommandParser):
    """Django's parser, whose usage errors keep the --json promise when the command runs from the command line.

    (In-process, `call_command` gets Django's CommandError as before: its caller has no stdout to read JSON from.)
    """

    wants_json = False

    def parse_args(  # type: ignore[override]  # one signature for argparse's overloads
        self, args: Sequence[str] | None = None, namespace: Namespace | None = None
    ) -> Namespace:
        self.wants_json = "--json" in (sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        if self.called_from_command_line and self.wants_json:
            sys.stdout.write(json.dumps({"ok": False, "error": message}) + "\n")
            self.print_usage(sys.stderr)
            sys.stderr.write(f"error: {message}\n")
            sys.exit(2)
        super().error(message)  # raises CommandError, or exits
        raise AssertionError("unreachable")  # (django-stubs does not say so)


class ContractCommand(BaseCommand):
    """A command whose errors are `error: <reason>` on stderr and exit 1 (with --json, also one JSON object on stdout).

    Not CommandError: Django would print "CommandError: …", and the contract says "error: …". A CommandError raised
    anyway (by Django itself, e.g. a failed system check) is turned into the same, and so is a database that is not
    there or not migrated (the operator's to fix, not a bug). Any other exception is a bug, not a user's error: with
    --json it still leaves one JSON object on stdout, and its traceback goes to stderr.
    """

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # Django builds its CommandParser itself; this gives that parser the contract's error().
        parser.__class__ = ContractParser
        return parser

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            return super().execute(*args, **options)
        except CommandError as exc:
            self.fail(str(exc), options.get("json", False))
        except (OperationalError, ProgrammingError) as exc:
            reason = f"the database cannot answer ({exc}): is it running, and migrated (`make setup`)?"
            self.fail(reason, options.get("json", False))
        except Exception as exc:
            if options.get("json"):
                self.stdout.write(json.dumps({"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}))
            raise

    def fail(self, reason: str, as_json: bool, details: tuple[str, ...] = (), **extra: object) -> NoReturn:
        if as_json:
            self.stdout.write(json.dumps({"ok": False, "error": reason, **extra}))
        self.stderr.write(f"error: {reason}")
        for line in details:
            self.stderr.write(f"  {line}")
        sys.exit(1)
