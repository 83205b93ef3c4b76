"""Dataclass fields -> argparse flags, the one way every settings class (EngineArgs, ServerArgs,
ServingLimits, PlanArgs) gets its command line. A field's flag is its name with vLLM's spelling
(--max-model-len), its help the field's `help` metadata, its type and choices its annotation
(`Literal[...]` gives the choices, `X | None` an optional X, `X | list[X]` one or more values, bool a
--flag / --no-flag pair); `aliases` adds vLLM's short forms (-tp)."""

import argparse
import dataclasses
import types
import typing
from collections.abc import Collection
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")

_SCALAR_TYPES = (int, float, str, bool)


def config_field(default: T, help: str, aliases: tuple[str, ...] = ()) -> T:
    """A dataclass field with its command-line help (shown by --help) and extra flag names (`aliases`)."""
    return dataclasses.field(default=default, metadata={"help": help, "aliases": aliases})


def flag_name(field_name: str) -> str:
    """The flag of a field: max_model_len -> --max-model-len."""
    return "--" + field_name.replace("_", "-")


def add_dataclass_cli_args(
    cls: type, parser: argparse.ArgumentParser | argparse._ArgumentGroup, only: Collection[str] | None = None
) -> None:
    """One flag per field of the dataclass `cls` (or per field named in `only`)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        value_type, choices = cli_type(hints[f.name])
        kwargs: dict[str, Any] = {"dest": f.name, "default": f.default, "help": f.metadata["help"]}
        if value_type is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = value_type
            if choices is not None:
                kwargs["choices"] = choices
            if takes_several(hints[f.name]):
                kwargs["nargs"] = "+"
        parser.add_argument(flag_name(f.name), *f.metadata.get("aliases", ()), **kwargs)


def dataclass_from_cli_args(cls: type[T], args: argparse.Namespace) -> T:
    """The dataclass `cls` built from the flags `add_dataclass_cli_args` added."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]  # NOTE: T is a dataclass
    return cls(**{name: getattr(args, name) for name in names})


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
