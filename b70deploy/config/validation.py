"""Turning schema (pydantic) errors into one-line UserErrors."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import UserError
from .yamlfile import loc_path
from .yamlfile import parse_yaml as parse_yaml  # re-exported: render/patches.py reads patch files with them
from .yamlfile import yaml_text as yaml_text

M = TypeVar("M", bound=BaseModel)

_FIXES = {
    "missing": "add the key",
    "int_type": "write a whole number without quotes",
    "float_type": "write a number without quotes",
    "bool_type": "write true or false",
    "string_type": "write a string",
    "list_type": "write a YAML list",
    "dict_type": "write a YAML mapping",
    "model_type": "write a YAML mapping",
    "model_attributes_type": "write a YAML mapping",
    "greater_than": "raise the value",
    "greater_than_equal": "raise the value",
    "less_than": "lower the value",
    "less_than_equal": "lower the value",
    "too_short": "add at least one entry",
    "string_too_short": "give a non-empty value",
    "int_from_float": "write a whole number",
}


def _clip(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def first_error(exc: ValidationError, model: type[BaseModel]) -> tuple[str, str, str]:
    """(key path, message, fix) for the first error pydantic found."""
    return _explain(exc.errors()[0], model)


def _clean_loc(loc: Sequence[Any]) -> list[Any]:
    """A pydantic location without its validator names and dict-key markers."""
    return [p for p in loc if not (isinstance(p, str) and (p.startswith("function-") or p == "[key]"))]


def _explain(err: Any, model: type[BaseModel]) -> tuple[str, str, str]:
    loc = _clean_loc(err["loc"])
    key = loc_path(loc) or "(top level)"
    kind = err["type"]
    msg = str(err["msg"])
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
        if "; fix: " in msg:
            what, fix = msg.split("; fix: ", 1)
            return key, what, fix
        return key, msg, "correct the value"
    if kind == "extra_forbidden":
        known = _known_keys(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.7) if loc else []
        if close:
            hint = f"did you mean {close[0]}? rename it, or remove it"
        else:
            hint = f"remove it or use one of: {', '.join(known)}" if known else "remove it"
        return key, "unknown key", hint
    if kind == "literal_error":
        return key, f"{_clip(err.get('input'))} is not allowed: {msg.lower()}", "use one of the listed values"
    if kind == "missing":
        return key, "required key is missing", "add the key"
    got = err.get("input")
    detail = f"{msg.lower()}, got {_clip(got)}" if kind.endswith("_type") else msg.lower()
    return key, detail, _FIXES.get(kind, "correct the value")


def value_error(model: type[BaseModel], loc: Sequence[str], value: Any) -> tuple[str, str, str] | None:
    """(key path, message, fix) if `value` alone is wrong at `loc` inside `model`, else None.

    Validates a document holding only that value and keeps the errors at or below `loc`,
    so a missing sibling key does not count. For a value a merge is about to drop unseen.
    """
    doc: Any = value
    for part in reversed(loc):
        doc = {part: doc}
    try:
        model.model_validate(doc)
    except ValidationError as exc:
        for err in exc.errors():
            if tuple(_clean_loc(err["loc"])[:len(loc)]) == tuple(loc):
                return _explain(err, model)
    return None


def _known_keys(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys allowed at `loc` inside `model`, for the "unknown key" hint."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(part) if hasattr(current, "model_fields") else None
        if field is None:
            return []
        current = _model_of(field.annotation)
    return sorted(current.model_fields) if current is not None and hasattr(current, "model_fields") else []


def _model_of(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


SHOWN_ERRORS = 5  # a file with many wrong keys: the first few, and how many more, on the one line


def validate(model: type[M], data: Mapping[str, Any], *, where: str | Any) -> M:
    """Validate `data`; `where` is a file name, or a callable mapping a key path to one. Every
    error of the document is in the one line (a fix-one, rerun, fix-the-next loop otherwise),
    named at the file of the first."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        found = [_explain(err, model) for err in exc.errors()]
        key, what, fix = found[0]
        path = where(key) if callable(where) else where
        if len(found) == 1:
            raise UserError(f"{key}: {what}", where=str(path), fix=fix) from None
        shown = found[:SHOWN_ERRORS]
        more = f"; and {len(found) - len(shown)} more" if len(found) > len(shown) else ""
        message = "; ".join(f"{k}: {w}" for k, w, _ in shown) + more
        fixes = "; ".join(f"{k}: {f}" for k, _, f in shown)
        raise UserError(f"{len(found)} errors: {message}", where=str(path), fix=fixes) from None
