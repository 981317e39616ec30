"""Every ServerConfig key as a command-line flag, generated from the schema (no per-key code).

`some_key: T = Field(default, description=...)` becomes `--some-key` with the description as its
help: booleans `--x/--no-x`, Literals their choices, lists repeatable and comma-separated
(`--compile-sizes 832x480x33,1280x704x121`), anything nested (node_groups) as JSON. Every flag
defaults to "not given", so only the flags a user types override the YAML's keys; pydantic
validates the result as it validates the YAML.
"""

from __future__ import annotations

import argparse
import json
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

DEST_PREFIX = "config."
SCALARS = (str, int, float)


class _ExtendSplit(argparse.Action):
    """Repeatable, each value split on commas: `--x a,b --x c` gives [a, b, c]."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = list(getattr(namespace, self.dest) or [])
        for part in (part.strip() for part in values.split(",")):
            try:
                items.extend([self.type_of_item(part)] if part else [])
            except ValueError as error:
                raise argparse.ArgumentError(self, f"invalid value {part!r}: {error}") from error
        setattr(namespace, self.dest, items)


def _without_none(annotation: Any) -> Any:
    """`X | None` -> X; other annotations unchanged."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error.msg}): {text!r}") from error


def _argument_options(name: str, annotation: Any) -> dict[str, Any]:
    """argparse keyword arguments for the field `name` of this type."""
    annotation = _without_none(annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is Literal:
        return {"type": type(args[0]), "choices": list(args), "metavar": "{" + ",".join(map(str, args)) + "}"}
    if annotation in SCALARS:
        return {"type": annotation, "metavar": name.upper()}
    if origin is list and len(args) == 1 and args[0] in SCALARS:
        return {"action": _ExtendSplit, "type_of_item": args[0], "metavar": "VALUE[,VALUE...]"}
    if origin is list and len(args) == 1 and getattr(args[0], "written_as_text", False):
        return {
            "action": _ExtendSplit,
            "type_of_item": str,
            "metavar": "VALUE[,VALUE...]",
        }  # the schema parses
    return {"type": _json_value, "metavar": "JSON"}


def _help(field: Any) -> str:
    text = field.description or ""
    default = field.default
    if default is not PydanticUndefined and default not in (None, [], {}):
        shown = _shown(default)
        text = f"{text} (default: {shown})" if text else f"default: {shown}"
    return text.replace("%", "%%")  # argparse formats help with %


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, SCALARS):
        return str(default)
    return json.dumps(default.model_dump() if isinstance(default, BaseModel) else default)


def add_config_flags(parser: argparse.ArgumentParser, schema: type[BaseModel]) -> None:
    """One flag per field of `schema`, in a group of their own; a flag the parser already has (a
    command's own option of the same name) is left to that option."""
    group = parser.add_argument_group("server config (each flag overrides the YAML key of its name)")
    for name, field in schema.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if flag in parser._option_string_actions:
            continue
        options = _argument_options(name, field.annotation)
        type_of_item = options.pop("type_of_item", None)
        action = group.add_argument(flag, dest=DEST_PREFIX + name, default=None, help=_help(field), **options)
        if type_of_item is not None:
            action.type, action.type_of_item = None, type_of_item


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """{key: value} of the config flags given on the command line."""
    return {
        dest[len(DEST_PREFIX) :]: value
        for dest, value in vars(args).items()
        if dest.startswith(DEST_PREFIX) and value is not None
    }
