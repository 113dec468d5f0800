"""Validation errors in words a caller of the API can act on.

pydantic's own text names its internals: a union's members appear in an error's location
(``sampling_params.SamplingParams.max_tokens``, ``response_format.tagged-union[...]``) and
``str(ValidationError)`` ends with a link to pydantic's site. :func:`first_problem` gives the
field as the caller spelled it (``sampling_params.max_tokens``, ``sampling_params.0.max_tokens``
for a list) and pydantic's message for it; :func:`describe` the same as one line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from . import types as _types

__all__ = ["describe", "first_problem"]

_PRIMITIVES = {"str", "int", "float", "bool", "none", "bytes"}
_CLASS = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_TYPE_NAMES = {
    name for name, value in vars(_types).items() if isinstance(value, type) and _CLASS.match(name)
}


def _is_label(part: object) -> bool:
    """A union member's label in a location (not a field the caller wrote)."""
    if not isinstance(part, str):
        return False
    return "[" in part or part in _PRIMITIVES or part in _TYPE_NAMES


def where(loc: Sequence[int | str]) -> str | None:
    """``loc`` without union labels, and without a tagged union's tag (the value of its
    ``type`` field, which follows its label), joined with dots; None when nothing is left."""
    parts: list[str] = []
    skip_tag = False
    for part in loc:
        if skip_tag:
            skip_tag = False
            continue
        if _is_label(part):
            skip_tag = isinstance(part, str) and part.startswith("tagged-union[")
            continue
        parts.append(str(part))
    return ".".join(parts) or None


def first_problem(
    errors: ValidationError | Sequence[Mapping[str, Any]], *, drop: Sequence[str] = ()
) -> tuple[str | None, str]:
    """The field and message of the most specific error: the one with the longest location
    (among a union's members, the member that got furthest), the first of those. ``drop``:
    leading location parts that are not fields (FastAPI's ``body``, ``query``)."""
    items = errors.errors() if isinstance(errors, ValidationError) else list(errors)
    if not items:
        return None, "invalid request"
    best = max(items, key=lambda e: len(e.get("loc", ())))  # max keeps the first of equals
    loc = [p for p in best.get("loc", ()) if p not in drop]
    return where(loc), str(best.get("msg", "invalid value"))


def describe(exc: ValidationError) -> str:
    """``field: message`` of :func:`first_problem` (``message`` alone without a field), and
    how many more problems there are."""
    param, message = first_problem(exc)
    text = f"{param}: {message}" if param else message
    more = exc.error_count() - 1
    return f"{text} (and {more} more)" if more > 0 and not _one_union(exc) else text


def _one_union(exc: ValidationError) -> bool:
    """Whether every error is a member of the same union failing (one problem, told per
    member), not several problems."""
    heads = {tuple(e["loc"][:1]) for e in exc.errors()}
    labelled = all(any(_is_label(p) for p in e["loc"]) for e in exc.errors())
    return len(heads) == 1 and labelled
