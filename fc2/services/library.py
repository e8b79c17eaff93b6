"""The library: renaming a bundle or dataset, and deleting one no job uses — the row and its file together."""

from __future__ import annotations

from django.db import transaction
from django.db.models import ProtectedError

from common.columns import max_length
from fc2.models import CodeBundle, Dataset


class LibraryError(Exception):
    """The operation was refused; the message says why, in words the owner can act on."""


def rename(item: CodeBundle | Dataset, name: str) -> None:
    name = name.strip()
    if not name:
        raise LibraryError("a name cannot be empty")
    longest = max_length(type(item), "name")
    if len(name) > longest:
        raise LibraryError(f"a name has at most {longest} characters")
    item.name = name
    item.save(update_fields=["name"])


def delete(item: CodeBundle | Dataset) -> None:
    """Delete `item` and its stored file; refused while any job uses it (the jobs keep what they ran)."""
    used = item.jobs.count()
    if used:
        raise LibraryError(f"{used} job{'s' if used != 1 else ''} used it; a job's record keeps what it ran on")
    field_file = item.wheel if isinstance(item, CodeBundle) else item.file
    stored = field_file.name
    try:
        with transaction.atomic():
            item.delete()
    except ProtectedError as exc:  # a job was submitted with it since the count above
        raise LibraryError("a job uses it now") from exc
    # The file goes only once the row is gone: a failed delete leaves both.
    if stored:
        field_file.storage.delete(stored)
