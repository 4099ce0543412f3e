"""One codec between the report model's frozen dataclasses and the dicts their JSON is made of.

Fields are written in declaration order and read back by their type hints (resolved once per
class): enums by value, tuples as lists, nested dataclasses and Optional values in turn. A class
declares what is special about its JSON in one ``JsonForm`` (its ``json_form`` class variable):
renamed keys, values changed on writing, properties written after the fields. A key missing
when read takes the field's default (older versions wrote fewer fields); a field without one
must be there (``KeyError``); keys the class does not know (the written properties) are skipped.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from typing import Any, TypeVar

__all__ = ["JsonForm", "decode", "encode", "plain_json"]

T = TypeVar("T")
Convert = Callable[[Any], Any]


@dataclass(frozen=True)
class JsonForm:
    """What a class's JSON does apart from writing each field under its name."""

    keys: Mapping[str, str] = field(default_factory=dict)  # field -> its JSON key
    written: Mapping[str, Convert] = field(default_factory=dict)  # field -> applied on writing
    derived: tuple[str, ...] = ()  # properties written after the fields, for readers; not read


@dataclass(frozen=True)
class _Plan:
    """A class's fields as written (field, key, writer) and as read (field, key, reader or None
    for a value read as it is, whether the key must be there)."""

    writes: tuple[tuple[str, str, Convert], ...]
    reads: tuple[tuple[str, str, Convert | None, bool], ...]
    derived: tuple[str, ...]


_PLAIN = frozenset({str, int, float, bool, type(None)})
_NUMBERS = frozenset({int, float, bool})


def plain_json(value: Any) -> Any:
    """``value`` made of JSON types: enums by value, tuples as lists, dataclasses encoded."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return encode(value)
    return value


def encode(obj: Any) -> dict[str, Any]:
    """The JSON-ready dict of a dataclass instance."""
    plan = _plan(type(obj))
    body = {key: write(getattr(obj, name)) for name, key, write in plan.writes}
    for name in plan.derived:
        body[name] = plain_json(getattr(obj, name))
    return body


def decode(cls: type[T], data: Mapping[str, Any]) -> T:
    """An instance of ``cls`` read from what ``encode`` wrote (or an older version of it)."""
    values = {}
    for name, key, read, required in _plan(cls).reads:
        if key in data:
            values[name] = data[key] if read is None else read(data[key])
        elif required:
            raise KeyError(key)
    return cls(**values)


@cache
def _plan(cls: type) -> _Plan:
    hints = typing.get_type_hints(cls)
    form: JsonForm = getattr(cls, "json_form", JsonForm())
    writes, reads = [], []
    for f in dataclasses.fields(cls):
        key, hint = form.keys.get(f.name, f.name), hints[f.name]
        write = _writer(hint)
        if f.name in form.written:
            write = _then(form.written[f.name], write)
        writes.append((f.name, key, write))
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        reads.append((f.name, key, _reader(hint), required))
    return _Plan(tuple(writes), tuple(reads), form.derived)


def _then(first: Convert, then: Convert) -> Convert:
    return lambda value: then(first(value))


def _optional(hint: Any) -> Any | None:
    """``X`` of ``X | None``; None for any other hint."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 else None


def _writer(hint: Any) -> Convert:
    """How a value of ``hint`` is written; ``plain_json`` where the hint says nothing more."""
    inner = _optional(hint)
    if inner is not None:
        write = _writer(inner)
        return lambda value: None if value is None else write(value)
    if hint in _NUMBERS:
        return _as_is
    if dataclasses.is_dataclass(hint):
        return encode
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and args[-1:] == (Ellipsis,):
        if args[0] in _NUMBERS:
            return list
        item = _writer(args[0])
        return lambda value: [item(v) for v in value]
    return plain_json


def _reader(hint: Any) -> Convert | None:
    """How a value of ``hint`` is read; None where the hint says nothing more (as it is)."""
    inner = _optional(hint)
    if inner is not None:
        read = _reader(inner)
        return None if read is None else lambda value: None if value is None else read(value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        members = {m.value: m for m in hint}  # a dict lookup: much faster than calling the enum
        return lambda value: (
            members[value] if type(value) is str and value in members else hint(value)
        )
    if dataclasses.is_dataclass(hint):
        return lambda value: decode(hint, value)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and args and args[-1] is Ellipsis:
        item = _reader(args[0])
        return tuple if item is None else lambda value: tuple(map(item, value))
    if origin is tuple and args:
        items = [_reader(a) or _as_is for a in args]
        return lambda value: tuple(read(v) for read, v in zip(items, value, strict=True))
    if origin is dict and args:
        item = _reader(args[1]) or _as_is
        return lambda value: {k: item(v) for k, v in value.items()}
    return None


def _as_is(value: Any) -> Any:
    return value
