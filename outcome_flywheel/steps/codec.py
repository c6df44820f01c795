"""The method's settings dataclasses as JSON and back: what an asset sends a step process as Pipes extras."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


class StepPayloadError(ValueError):
    """A value that cannot travel to a step process as JSON (or does not fit the dataclass it is read as)."""


def to_payload(obj: Any) -> dict:
    """A dataclass instance as a JSON-ready dict (nested dataclasses too, tuples as lists)."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise StepPayloadError(
            f"{type(obj).__name__} is not a settings dataclass: a step process rebuilds its resources from their "
            "settings, so a resource given as another object can only run with the in-process step runner's caller"
        )
    data = dataclasses.asdict(obj)
    try:
        return json.loads(json.dumps(data, allow_nan=True))
    except TypeError as err:
        raise StepPayloadError(f"{type(obj).__name__} holds a value that is not JSON: {err}") from err


def from_payload(cls: type[T], data: dict) -> T:
    """An instance of dataclass `cls` from `to_payload`'s dict, nested dataclasses and tuples rebuilt
    from the field types; an unknown field is an error, a missing one takes its default."""
    if not isinstance(data, dict):
        raise StepPayloadError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise StepPayloadError(f"{cls.__name__} has no field(s) {', '.join(unknown)}")
    return cls(**{name: _value(hints[name], value) for name, value in data.items()})


def _value(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        dataclass_options = [a for a in options if dataclasses.is_dataclass(a)]
        if dataclass_options and isinstance(value, dict):
            return from_payload(dataclass_options[0], value)
        return _value(options[0], value) if len(options) == 1 else value
    if dataclasses.is_dataclass(hint):
        return from_payload(hint, value)
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    return value
