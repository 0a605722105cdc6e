"""A tiny RFC 6902 ``add`` (the only operation the webhook emits), strict where the API
server is: the parent of every target must exist, an array index must be in range."""

from __future__ import annotations

import copy
from typing import Any


def apply(document: Any, patch: list[dict[str, Any]]) -> Any:
    """``document`` with ``patch`` applied, the original untouched."""
    result = copy.deepcopy(document)
    for operation in patch:
        assert operation["op"] == "add", operation
        tokens = [
            token.replace("~1", "/").replace("~0", "~")
            for token in operation["path"].split("/")[1:]
        ]
        assert operation["path"].startswith("/") and tokens, operation
        parent = result
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last, value = tokens[-1], copy.deepcopy(operation["value"])
        if isinstance(parent, list):
            if last == "-":
                parent.append(value)
            else:
                assert 0 <= int(last) <= len(parent), operation
                parent.insert(int(last), value)
        else:
            assert isinstance(parent, dict), operation
            parent[last] = value
    return result
