"""JSON as the platform takes it from whoever wrote it (a request's body, a node's report or its metrics.json):
bounded in depth — nesting deeper than MAX_JSON_DEPTH is bad JSON, never a RecursionError — and, once decoded, made
storable and showable by every layer (`clean`: no NaN, no NUL, no number a float cannot hold, strings within a bound),
with a note of each change. A leaf module (stdlib only): every layer may use it."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any, TypeVar

# The deepest a JSON body may nest (`[[…]]` is 2 deep): no request of the platform's comes near it, and a body nested
# a hundred thousand deep would otherwise end in a RecursionError (a 500) in the decoder or in whatever walks it.
MAX_JSON_DEPTH = 64

T = TypeVar("T")


def json_depth(data: object, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep `data` nests arrays and objects (a scalar: 0), counted without recursion; it stops counting once past
    `limit`.

    >>> json_depth(1), json_depth([]), json_depth({"a": [1, {"b": []}]}), json_depth([[[[]]]], limit=2)
    (0, 1, 4, 3)
    """
    deepest, stack = 0, [(data, 1)]
    while stack and deepest <= limit:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def check_json_depth(data: T, limit: int = MAX_JSON_DEPTH) -> T:
    """`data` itself, or a ValueError when it nests deeper than `limit`."""
    if json_depth(data, limit) > limit:
        raise ValueError(f"nested deeper than {limit} levels")
    return data


def loads(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, but nesting deeper than `limit` is a ValueError as bad JSON is, never a RecursionError."""
    try:
        data = json.loads(text)
    except RecursionError:  # the decoder's own recursion, well past `limit`
        raise ValueError(f"nested deeper than {limit} levels") from None
    return check_json_depth(data, limit)


# What every layer can store and show. PostgreSQL refuses NUL in text and `\u0000` in json/jsonb, and UTF-8 cannot
# encode a lone surrogate (json.loads makes one of "\ud800"): each becomes U+FFFD, the replacement character. NaN and
# ±Infinity (json.loads reads them; Python's json.dump writes them for a diverged loss) are no JSON, and PostgreSQL
# refuses them: null. So is an integer no float holds (10**400 is valid JSON): each page turns a number into a float,
# and that would raise OverflowError.
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
FLOAT_MAX = int(sys.float_info.max)
PATHS_NAMED = 5  # of the places a kind of change was made, those its note names; the rest are counted


def clean_text(text: str) -> str:
    r"""`text` with each character no database can store replaced by U+FFFD.

    >>> clean_text("a\x00b\ud800c") == "a\ufffdb\ufffdc"
    True
    """
    return UNSTORABLE.sub("\ufffd", text)


def clean(data: object, *, max_string: int | None = None, limit: int = MAX_JSON_DEPTH) -> tuple[object, list[str]]:
    r"""Decoded JSON as every layer can store and show it (UNSTORABLE above), strings cut to `max_string`
    characters; and one note per kind of change, naming where it was made (`a.b[]`: an item of the list `a.b`). A
    ValueError when it nests deeper than `limit`.

    >>> clean({"loss": float("nan"), "big": [1, 10**400, 2**70], "s": "abcdef"}, max_string=4)[0]
    {'loss': None, 'big': [1, None, 1180591620717411303424], 's': 'abcd'}
    >>> for line in clean({"loss": float("nan"), "big": [10**400], "n\x00": 0})[1]: print(line)
    not a finite number (NaN or ±Infinity) at loss: kept as null
    an integer too large for a float at big[]: kept as null
    a character no database stores (NUL, a lone surrogate) at n�: replaced by U+FFFD
    """
    check_json_depth(data, limit)
    found: dict[tuple[str, str], list[str]] = {}  # (what was found, what became of it) -> where

    def note(kind: str, outcome: str, path: str) -> None:
        paths = found.setdefault((kind, outcome), [])
        if path not in paths:
            paths.append(path)

    def text(value: str, path: str) -> str:
        if UNSTORABLE.search(value):
            value = clean_text(value)
            note("a character no database stores (NUL, a lone surrogate)", "replaced by U+FFFD", clean_text(path))
        if max_string is not None and len(value) > max_string:
            note(f"a string over {max_string:,} characters", f"cut to {max_string:,}", clean_text(path))
            value = value[:max_string]
        return value

    def walk(value: object, path: str) -> object:
        if isinstance(value, float) and not math.isfinite(value):
            note("not a finite number (NaN or ±Infinity)", "kept as null", path)
            return None
        if isinstance(value, int) and not isinstance(value, bool) and not -FLOAT_MAX <= value <= FLOAT_MAX:
            note("an integer too large for a float", "kept as null", path)
            return None
        if isinstance(value, str):
            return text(value, path)
        if isinstance(value, list):
            return [walk(item, f"{path}[]") for item in value]
        if isinstance(value, dict):
            cleaned = {}
            for key, item in value.items():
                inside = f"{path}.{key}" if path else str(key)
                cleaned[text(key, inside) if isinstance(key, str) else key] = walk(item, clean_text(inside))
            return cleaned
        return value

    cleaned = walk(data, "")
    notes = []
    for (kind, outcome), paths in found.items():
        named = ", ".join(path[:80] or "the top level" for path in paths[:PATHS_NAMED])
        more = f" and {len(paths) - PATHS_NAMED} more places" if len(paths) > PATHS_NAMED else ""
        notes.append(f"{kind} at {named}{more}: {outcome}")
    return cleaned, notes
