"""Query strings are input: the fields and the one reader every page's query parameters go through.

A page reads its query string through a form of these fields (the API through DRF serializers, fc2/jobs_api.py), so
that no value reaches a query or a computation unchecked: digits other than ASCII's ("²" is a digit to `str.isdigit`,
not to `int`), NUL (which PostgreSQL refuses in text), numbers past a bigint or past Python's int conversion, dates
that do not exist or cannot be moved to UTC. `read()` is how a page applies such a form: a value that does not pass is
ignored, and the page says so in a message, or the caller answers 400 where the answer depends on it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest
from django.utils import timezone

MAX_ID = 2**63 - 1  # the largest row id a bigint holds: a larger one names no row


def as_id(text: str) -> int | None:
    """The row id `text` spells in ASCII digits, else None (a number past MAX_ID names no row).

    >>> as_id("42"), as_id("²"), as_id("9" * 40), as_id("0"), as_id("-1")
    (42, None, None, None, None)
    """
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(MAX_ID)):
        return None
    number = int(text)
    return number if 1 <= number <= MAX_ID else None


class IdField(forms.IntegerField):
    """A row's id: ASCII digits from 1 to MAX_ID."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(min_value=1, max_value=MAX_ID, **kwargs)

    def to_python(self, value: Any) -> int | None:
        if value in self.empty_values:
            return None
        if (number := as_id(str(value).strip())) is None:
            raise forms.ValidationError("Must be the id of a row (a whole number from 1).", code="invalid")
        return number


class DateTimeField(forms.DateTimeField):
    """An ISO 8601 date and time, naive ones taken as UTC; one that exists and can be compared with the database's
    (a year-1 or year-9999 time with an offset cannot be moved to UTC). A `+` in a query string is a space: an offset
    sent unescaped (`…T10:00:00+00:00`) is read as meant."""

    def to_python(self, value: Any) -> datetime | None:
        if isinstance(value, str):
            value = value.strip().replace(" ", "+")
        return super().to_python(value)

    def clean(self, value: Any) -> datetime | None:
        moment = super().clean(value)
        if moment is None:
            return None
        if timezone.is_naive(moment):
            moment = moment.replace(tzinfo=UTC)
        try:
            moment.astimezone(UTC)
        except OverflowError:
            raise forms.ValidationError("Must be a date and time from year 1 to 9999 in UTC.", code="invalid") from None
        return moment


def read(request: HttpRequest, form: forms.Form) -> dict:
    """What passed of a query form bound to the query string: each field that did not is left out (as if not given),
    and the page's messages say which was ignored and why (a field's label names it to the user)."""
    form.is_valid()
    for name, errors in form.errors.items():
        field = form.fields.get(name)
        label = (field.label if field is not None else None) or name
        messages.warning(request, f"Ignored the {label}: {' '.join(map(str, errors))}")
    return form.cleaned_data
