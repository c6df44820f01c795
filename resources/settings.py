"""How resources read the environment and mirror the method's dataclasses as Dagster config.

A variable that is set becomes a `dg.EnvVar` (shown as such in the Dagster UI, resolved when a run
starts); one that is not falls back to the default of the dataclass field the resource configures,
so every default and help text has one home: the dataclass in `outcome_flywheel`. A run config that
sets some of a resource's fields sets those alone: the others keep what the environment gave them
(`layered_config_schema`).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import os
import types
import typing
from typing import Any, ClassVar, Generic, Mapping, Optional, TypeVar

import dagster as dg
from pydantic import Field

from outcome_flywheel.settings import DEFAULTS, RULES, SECRETS, SettingsError

__all__ = [
    "DataclassResource",
    "env_int_or_default",
    "env_or_default",
    "layered_config_schema",
    "mirrored",
    "nested_dataclass",
    "run_config_fields",
    "run_config_overrides",
]

PlainT = TypeVar("PlainT")


class DataclassResource(dg.ConfigurableResource[PlainT], Generic[PlainT]):
    """A resource whose fields are those of the dataclass `plain` (declared with `mirrored`); assets
    receive the dataclass, built from the resolved fields when a run starts."""

    # `ConfigurableResource.create_resource` may hand out another object than the resource itself
    # (Dagster's documented pattern for a third-party or plain class, received through
    # `dg.ResourceParam`): here the dataclass.

    plain: ClassVar[type]
    # field -> the FLYWHEEL_* variable it mirrors. The variable's rule (outcome_flywheel.settings.RULES)
    # holds for the resolved field too, checked when a run starts: the run config may set the field.
    # Not pydantic constraints (ge=1): Dagster checks those against an EnvVar's placeholder (0) at
    # load, so any value of the variable would stop the code location from loading.
    variables: ClassVar[Mapping[str, str]] = {}

    @property
    def _config_schema(self):
        return layered_config_schema(super()._config_schema)

    def create_resource(self, context) -> PlainT:
        self.check_variables()
        return self.plain(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self.plain)})

    def check_variables(self) -> None:
        """Raise `SettingsError` when a resolved field breaks the rule of the variable it mirrors.
        Each field on its own: a combination (min_headlines over max_headlines) is the checks' to report."""
        problems = []
        for field, name in self.variables.items():
            value = str(getattr(self, field))
            problem = RULES[name].problem(value)
            if problem:
                shown = "<hidden>" if name in SECRETS else repr(value)
                problems.append(f"{field}={shown} ({name}): {problem}; allowed: {RULES[name].allowed}")
        if problems:
            raise SettingsError(f"{type(self).__name__}: " + "; ".join(problems))


def layered_config_schema(schema: Any) -> Any:
    """A resource's config schema with the environment first and the run config on top, field by field.

    Dagster makes the values a resource was built with (`from_env`: an EnvVar for each variable that is
    set) the default of its config as a whole, so a run config that set one field replaced them all, each
    other field falling back to the class's default (FLYWHEEL_FEEDS_ARCHIVE lost under
    `resources.feeds.config.max_headlines: 12`). Here each field's default is the value it was built
    with, so a run config changes the fields it names and no other. Used by every resource's
    `_config_schema`: Dagster's own property (not public API; the public `dg.Field` and `dg.Shape` are
    what it returns), which the resource definition and its run-time config processing both read;
    tests/test_settings_load.py holds each field to it, so an upgrade that moves the hook fails there."""
    field = schema.as_field()
    shape, built = field.config_type, field.default_value if field.default_provided else None
    if not isinstance(shape, dg.Shape) or not isinstance(built, dict):
        return schema
    fields = {
        name: dg.Field(inner.config_type, default_value=built[name], is_required=False, description=inner.description)
        if name in built
        else inner
        for name, inner in shape.fields.items()
    }
    layered = dg.Shape(fields, description=shape.description, field_aliases=shape.field_aliases)
    return dg.Field(layered, default_value=built, is_required=False, description=field.description)


def env_or_default(name: str, default: Any = None):
    """`dg.EnvVar(name)` when the variable is set, else `default`, else the project default."""
    if os.environ.get(name) not in (None, ""):
        return dg.EnvVar(name)
    return default if default is not None else DEFAULTS[name]


def env_int_or_default(name: str, default: int | None = None):
    """Integer form of `env_or_default` (`dg.EnvVar.int` when set)."""
    if os.environ.get(name) not in (None, ""):
        return dg.EnvVar.int(name)
    return default if default is not None else int(DEFAULTS[name])


def dataclass_field(cls: type, name: str) -> dataclasses.Field:
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    if name not in by_name:
        raise AttributeError(f"{cls.__name__} has no field {name!r}")
    return by_name[name]


def field_default(cls: type, name: str) -> Any:
    """The default of dataclass `cls`'s field `name`."""
    f = dataclass_field(cls, name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def mirrored(cls: type, name: str, optional: bool = False, **extra) -> Any:
    """A pydantic `Field` for config field `name`, described by dataclass `cls`'s help.

    `optional=False` (resources): the default is the dataclass's, shown in the UI.
    `optional=True` (run config): the default is None and the description names the dataclass's
    default, which applies when the field is left out (TRL's one-source-of-truth pattern).
    """
    f = dataclass_field(cls, name)
    help_text = f.metadata.get("help", "")
    if optional:
        return Field(
            default=None, description=f"{help_text} Default: {field_default(cls, name)!r} ({cls.__name__}).", **extra
        )
    return Field(default=field_default(cls, name), description=help_text, **extra)


def set_fields(config: Any, names: list[str] | tuple[str, ...]) -> dict:
    """The fields of a run config that were given (not None), for `dataclasses.replace`: a flat run
    config whose every field is the dataclass field of its name (`run_config_overrides`)."""
    return run_config_overrides(config, {n: n for n in names})


# -- a flat run config over nested dataclasses ------------------------------------------------------
# A run config is flat (one launchpad field per setting), the settings it overrides nested
# (DailyUpdateSettings.gspo.learning_rate). The method declares run-config field -> dotted path
# (e.g. outcome_flywheel.daily_rl.day_settings.RUN_CONFIG_PATHS); the config's fields and the settings it
# builds are derived from that table and the dataclasses' fields (type, default, help).


def _field_type(cls: type, name: str) -> Any:
    """The resolved annotation of dataclass `cls`'s field `name` (the modules use postponed annotations)."""
    dataclass_field(cls, name)
    return typing.get_type_hints(cls)[name]


def _without_none(hint: Any) -> Any:
    """`X` of `X | None` (a field whose None means "decided later"); `hint` itself otherwise."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kept = [a for a in typing.get_args(hint) if a is not type(None)]
        return kept[0] if len(kept) == 1 else typing.Union[tuple(kept)]
    return hint


def path_field(cls: type, path: str) -> tuple[type, str]:
    """(the dataclass that owns the last part of dotted `path` below `cls`, that field's name)."""
    *sections, leaf = path.split(".")
    owner = cls
    for section in sections:
        owner = _without_none(_field_type(owner, section))
    dataclass_field(owner, leaf)
    return owner, leaf


def _config_type(hint: Any) -> Any:
    """The run-config type of a dataclass field's annotation: optional (left out = the default), a read-only
    `Mapping` as the `dict` and a `tuple[X, ...]` as the `list[X]` Dagster's config knows."""
    base = _without_none(hint)
    if typing.get_origin(base) is collections.abc.Mapping:
        base = dict[typing.get_args(base)]
    elif typing.get_origin(base) is tuple and typing.get_args(base)[1:] == (Ellipsis,):
        base = list[typing.get_args(base)[0]]  # Dagster's config has lists, not tuples
    return Optional[base]


def run_config_fields(
    cls: type,
    paths: Mapping[str, str | None],
    own: Mapping[str, tuple[Any, Any]] | None = None,
    descriptions: Mapping[str, str] | None = None,
) -> dict[str, tuple[Any, Any]]:
    """The (type, pydantic Field) of each field of a flat run config over dataclass `cls`, in `paths`' order.

    Every field defaults to None (left out) and its description names the dataclass's default
    (`mirrored(optional=True)`), so a run config's given fields can be told from the rest, which may take
    another layer's default (a model's own). `own`: the fields whose path is None, declared by the caller;
    `descriptions`: a description instead of the dataclass's help, for fields that carry none."""
    own, descriptions = own or {}, descriptions or {}
    if {name for name, path in paths.items() if path is None} != set(own):
        raise ValueError("run_config_fields: `own` must declare exactly the fields whose path is None")
    fields = {}
    for name, path in paths.items():
        if path is None:
            fields[name] = own[name]
            continue
        owner, leaf = path_field(cls, path)
        hint = _config_type(_field_type(owner, leaf))
        if name in descriptions:
            fields[name] = (hint, Field(default=None, description=descriptions[name]))
        else:
            fields[name] = (hint, mirrored(owner, leaf, optional=True))
    return fields


def run_config_overrides(config: Any, paths: Mapping[str, str | None]) -> dict[str, Any]:
    """dotted path -> value of each run-config field that was given (not None) and maps onto a path."""
    return {
        path: getattr(config, name)
        for name, path in paths.items()
        if path is not None and getattr(config, name) is not None
    }


def nested_dataclass(cls: type, overrides: Mapping[str, Any]) -> Any:
    """An instance of dataclass `cls` with each dotted path of `overrides` set and every other field at its
    default; a nested section is built from its own paths, unless `overrides` sets the section whole."""
    own: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for path, value in overrides.items():
        head, _, rest = path.partition(".")
        if rest:
            sections.setdefault(head, {})[rest] = value
        else:
            own[head] = value
    for head, section in sections.items():
        if head not in own:  # set whole (gspo.lora = None for a full fine-tune): its fields do not apply
            own[head] = nested_dataclass(_without_none(_field_type(cls, head)), section)
    return cls(**own)
