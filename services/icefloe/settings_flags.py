"""Command-line flags for a pydantic settings class, and errors named the way users set them.

The coordinator and the planner read their settings from the environment and let an operator
override any of them with a flag of the same name. Deriving the flags from the settings
class keeps the two in step: a new setting gets its flag, with its environment variable in
the help text, without anyone remembering to add it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pydantic


def add_arguments(
    parser: argparse.ArgumentParser, settings: type[pydantic.BaseModel], env_prefix: str
) -> None:
    """One flag per setting (``--batch-max-files``, ``--check-files/--no-check-files``...).

    Every flag defaults to None, so only flags actually given override the environment.
    """
    for name, info in settings.model_fields.items():
        extra = info.json_schema_extra
        if isinstance(extra, dict) and extra.get("flag") is False:
            continue  # a secret: the environment or a file only, never the command line
        flag = "--" + name.replace("_", "-")
        annotation = info.annotation
        text = info.description or ""
        env = f"{env_prefix}{name.upper()}"
        help_text = f"{text} (env {env})" if text else f"env {env}"
        if annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif annotation is int or annotation == (int | None):
            parser.add_argument(flag, dest=name, type=int, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=help_text)


def overrides_from_args(
    args: argparse.Namespace, settings: type[pydantic.BaseModel]
) -> dict[str, Any]:
    """The settings whose flags were given, ready to pass as overrides."""
    return {
        name: getattr(args, name)
        for name in settings.model_fields
        if getattr(args, name, None) is not None
    }


def describe_problems(error: pydantic.ValidationError, name_of: Callable[[str], str]) -> str:
    """Each validation problem, led by the setting's name as the user writes it.

    ``name_of`` maps a field name to that spelling (an environment variable, a Spark key).
    """
    problems = []
    for err in error.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        where = name_of(loc) if loc else "settings"
        problems.append(f"{where}: {err.get('msg', 'invalid value')}")
    return "; ".join(problems)


__all__ = ["add_arguments", "describe_problems", "overrides_from_args"]
