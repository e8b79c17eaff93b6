"""Uploaded files that live and die with their rows: a rolled-back transaction leaves no file behind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.db import transaction
from django.db.models.fields.files import FieldFile

_stored: ContextVar[list[FieldFile] | None] = ContextVar("_stored", default=None)


def track(field_file: FieldFile) -> None:
    """Remember a file just saved, so that `atomic_with_files` deletes it if the transaction fails."""
    stored = _stored.get()
    if stored is not None:
        stored.append(field_file)


@contextmanager
def atomic_with_files() -> Iterator[None]:
    """transaction.atomic() that also deletes the files tracked inside it when it rolls back."""
    parent = _stored.get()
    stored: list[FieldFile] = []
    token = _stored.set(stored)
    try:
        with transaction.atomic():
            yield
    except BaseException:
        for field_file in stored:
            if field_file.name:
                field_file.storage.delete(field_file.name)
        raise
    else:
        if parent is not None:  # nested: the outer transaction can still roll these back
            parent.extend(stored)
    finally:
        _stored.reset(token)
