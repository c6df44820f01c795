"""How resources read the environment and mirror the method's dataclasses as Dagster config.

A variable that is set becomes a `dg.EnvVar` (shown as such in the Dagster UI, resolved when a run
starts); one that is not falls back to the default of the dataclass field the resource configures,
so every default and help text has one home: the dataclass in `outcome_flywheel`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar, Generic, Mapping, TypeVar

import dagster as dg
from pydantic import Field

from outcome_flywheel.settings import DEFAULTS, RULES, SECRETS, SettingsError

__all__ = ["DataclassResource", "env_int_or_default", "env_or_default", "mirrored"]

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
        return Field(default=None, description=f"{help_text} Default: {field_default(cls, name)!r} ({cls.__name__}).", **extra)
    return Field(default=field_default(cls, name), description=help_text, **extra)


def set_fields(config: Any, names: list[str] | tuple[str, ...]) -> dict:
    """The fields of a run config that were given (not None), for `dataclasses.replace`."""
    return {n: getattr(config, n) for n in names if getattr(config, n) is not None}
