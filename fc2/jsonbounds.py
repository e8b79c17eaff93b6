"""JSON bounded in depth, whoever parses it (a request's body, a node's report or its metrics.json): nesting deeper than
MAX_JSON_DEPTH is bad JSON, never a RecursionError. A leaf module (stdlib only): every layer may use it."""

from __future__ import annotations

import json

# The deepest a JSON body may nest (`[[…]]` is 2 deep): no request of the platform's comes near it, and a body nested
# a hundred thousand deep would otherwise end in a RecursionError (a 500) in the decoder or in whatever walks it.
MAX_JSON_DEPTH = 64


def json_depth(data, limit: int = MAX_JSON_DEPTH) -> int:
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


def check_json_depth(data, limit: int = MAX_JSON_DEPTH):
    """`data` itself, or a ValueError when it nests deeper than `limit`."""
    if json_depth(data, limit) > limit:
        raise ValueError(f"nested deeper than {limit} levels")
    return data


def loads(text: str | bytes, limit: int = MAX_JSON_DEPTH):
    """json.loads, but nesting deeper than `limit` is a ValueError as bad JSON is, never a RecursionError."""
    try:
        data = json.loads(text)
    except RecursionError:  # the decoder's own recursion, well past `limit`
        raise ValueError(f"nested deeper than {limit} levels") from None
    return check_json_depth(data, limit)
