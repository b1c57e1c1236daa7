"""A frozen dataclass's hash, computed once per object.

The search looks its configurations up in `functools.lru_cache`s hundreds of thousands of times per plan; a
dataclass's generated `__hash__` rehashes every field each time (a model's per-layer patterns, a layout's stage
lists). A class that defines `__hash__ = cached_hash` keeps the generated `__eq__` and hashes the same field tuple,
once (dataclasses leaves an explicit `__hash__` of a frozen class alone)."""

from __future__ import annotations

import dataclasses
from typing import Any


def cached_hash(obj: Any) -> int:
    try:
        return obj.__dict__["_cached_hash"]
    except KeyError:
        value = hash(tuple(getattr(obj, f.name) for f in dataclasses.fields(obj)))
        object.__setattr__(obj, "_cached_hash", value)
        return value
