"""Dataclass fields -> argparse flags, the one way every settings class (EngineArgs, ServerArgs,
ServingLimits, PlanArgs) gets its command line. A field's flag is its name with vLLM's spelling
(--max-model-len), its help the field's `help` metadata, its type and choices its annotation
(`Literal[...]` gives the choices, `X | None` an optional X, `X | list[X]` one or more values, bool a
--flag / --no-flag pair); `aliases` adds vLLM's short forms (-tp), `action` an argparse action of its own."""

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Collection
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")

_SCALAR_TYPES = (int, float, str, bool)


def config_field(
    default: T, help: str, aliases: tuple[str, ...] = (), action: type[argparse.Action] | None = None
) -> T:
    """A dataclass field with its command-line help (shown by --help), extra flag names (`aliases`) and
    the argparse action that stores it (default: its annotation's)."""
    return dataclasses.field(default=default, metadata={"help": help, "aliases": aliases, "action": action})


class NamedValues(argparse.Action):
    """A flag that takes one value (stored as usual), or `NAME=VALUE` any number of times: those are
    collected in `<dest>_by_name` (`--model NAME=PATH`, repeated). A value that is an existing path is
    never a NAME=VALUE, so a file whose name holds '=' still loads."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, str), "a NamedValues flag takes one value at a time"
        if "=" in values and not os.path.exists(values):
            named = getattr(namespace, f"{self.dest}_by_name", None) or []
            setattr(namespace, f"{self.dest}_by_name", [*named, values])
        else:
            setattr(namespace, self.dest, values)


def flag_name(field_name: str) -> str:
    """The flag of a field: max_model_len -> --max-model-len."""
    return "--" + field_name.replace("_", "-")


def add_dataclass_cli_args(
    cls: type, parser: argparse.ArgumentParser | argparse._ArgumentGroup, only: Collection[str] | None = None
) -> None:
    """One flag per field of the dataclass `cls` (or per field named in `only`) made by config_field."""
    hints = typing.get_type_hints(cls)
    for f in _flag_fields(cls):
        if only is not None and f.name not in only:
            continue
        value_type, choices = cli_type(hints[f.name])
        kwargs: dict[str, Any] = {"dest": f.name, "default": f.default, "help": f.metadata["help"]}
        if value_type is bool and f.metadata.get("action") is None:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = value_type
            if f.metadata.get("action") is not None:
                kwargs["action"] = f.metadata["action"]
            if choices is not None:
                kwargs["choices"] = choices
            if takes_several(hints[f.name]):
                kwargs["nargs"] = "+"
        parser.add_argument(flag_name(f.name), *f.metadata.get("aliases", ()), **kwargs)


def dataclass_from_cli_args(cls: type[T], args: argparse.Namespace) -> T:
    """The dataclass `cls` built from the flags `add_dataclass_cli_args` added."""
    return cls(**{f.name: getattr(args, f.name) for f in _flag_fields(cls)})


def _flag_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields with a flag: config_field's (a plain field is set from other flags by its caller)."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def takes_several(annotation: object) -> bool:
    """Whether the flag of a field takes one or more values: its annotation is `X | list[X]` (or None)."""
    return typing.get_origin(annotation) in (Union, types.UnionType) and any(
        typing.get_origin(a) is list for a in typing.get_args(annotation)
    )


def cli_type(annotation: object) -> tuple[type, tuple[object, ...] | None]:
    """(argparse type, choices or None) of a field annotation: a scalar, a Literal, either | None, or
    `X | list[X]` (several values: `takes_several`). Raises TypeError for anything else (a settings
    field the command line cannot express)."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        lists = [a for a in members if typing.get_origin(a) is list]
        if len(lists) == 1 and typing.get_args(lists[0]) == tuple(a for a in members if a is not lists[0]):
            members = list(typing.get_args(lists[0]))
        if len(members) != 1:
            raise TypeError(f"{annotation} has more than one non-None type; a flag takes one.")
        annotation = members[0]
    if typing.get_origin(annotation) is Literal:
        choices = typing.get_args(annotation)
        return type(choices[0]), choices
    if isinstance(annotation, type) and annotation in _SCALAR_TYPES:
        return annotation, None
    raise TypeError(f"{annotation} cannot be a command-line flag: use int, float, str, bool or a Literal.")
