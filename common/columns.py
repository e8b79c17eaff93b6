"""What a model's column holds, as the checks at the door (forms, imports, the API's services) state it to a user."""

from __future__ import annotations

from django.db.models import CharField, Model


def max_length(model: type[Model], name: str) -> int:
    """The most characters the text column `name` of `model` holds (its CharField's max_length)."""
    field = model._meta.get_field(name)
    if not isinstance(field, CharField) or field.max_length is None:
        raise TypeError(f"{model.__name__}.{name} is no text column of bounded length")
    return field.max_length
