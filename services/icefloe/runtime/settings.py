"""Command-line flags for a pydantic settings class, and errors named the way users set them.

The coordinator and the planner read their settings from the environment and let an operator
override any of them with a flag of the same name. Deriving the flags from the settings
class keeps the two in step: a new setting gets its flag, with its environment variable in
the help text, without anyone remembering to add it.

Secrets (fields typed :class:`pydantic.SecretStr`) get no flag: a command line is visible
to every user of the machine in ``ps`` and in the process table of a container. They come
from the environment or from files: with ``ICEFLOE_SECRETS_DIR`` set (say, a mounted
Kubernetes secret volume), a file named like the environment variable (for instance
``ICEFLOE_SASL_PASSWORD``) holds the value.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, get_args, get_origin

import pydantic
from pydantic_settings import BaseSettings

from icefloe.errors import ValidationError
from icefloe.spec import model

SECRETS_DIR_ENV = "ICEFLOE_SECRETS_DIR"

S = TypeVar("S", bound=BaseSettings)


def is_secret(info: Any) -> bool:
    """Whether a settings field holds a secret (``SecretStr`` or ``SecretStr | None``)."""
    annotation = info.annotation
    return annotation is pydantic.SecretStr or annotation == (pydantic.SecretStr | None)


def add_arguments(
    parser: argparse.ArgumentParser, settings: type[pydantic.BaseModel], env_prefix: str
) -> None:
    """One flag per setting (``--batch-max-files``, ``--check-files/--no-check-files``...).

    Every flag defaults to None, so only flags actually given override the environment.
    Secrets get no flag (see the module docstring).
    """
    for name, info in settings.model_fields.items():
        extra = info.json_schema_extra
        if is_secret(info) or (isinstance(extra, dict) and extra.get("flag") is False):
            continue  # a secret: the environment or a file only, never the command line
        flag = "--" + name.replace("_", "-")
        annotation = info.annotation
        text = info.description or ""
        env = f"{env_prefix}{name.upper()}"
        if "default" not in text and "unset:" not in text:  # else the text says the default
            default = (
                "required"
                if info.is_required()
                else "default: unset"
                if info.default is None
                else f"default: {info.default}"
            )
            text = f"{text}; {default}" if text else default
        help_text = f"{text} (env {env})"
        if annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif annotation is int or annotation == (int | None):
            parser.add_argument(flag, dest=name, type=int, default=None, help=help_text)
        elif get_origin(annotation) is Literal:
            choices = [str(c) for c in get_args(annotation)]
            parser.add_argument(flag, dest=name, default=None, choices=choices, help=help_text)
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


def load_settings(
    settings: type[S], overrides: Mapping[str, Any] | None, env_prefix: str, what: str
) -> S:
    """Settings from the environment and the secrets directory, with ``overrides`` on top.

    Only non-None overrides count. Raises a ValidationError naming each bad setting by its
    environment variable, so the message says what the operator has to change.
    """
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    try:
        return settings(_secrets_dir=secrets_dir(), **given)
    except pydantic.ValidationError as e:
        problems = describe_problems(e, lambda loc: f"{env_prefix}{loc.upper()}")
        raise ValidationError(f"invalid {what} settings: {problems}") from None


def secrets_dir() -> str | None:
    """The directory ``ICEFLOE_SECRETS_DIR`` names, if set (ValidationError if it is none)."""
    path = os.environ.get(SECRETS_DIR_ENV) or None
    if path is not None and not os.path.isdir(path):
        raise ValidationError(f"{SECRETS_DIR_ENV}={path!r} is not a directory")
    return path


def describe_problems(error: pydantic.ValidationError, name_of: Callable[[str], str]) -> str:
    """Each validation problem, led by the setting's name as the user writes it.

    ``name_of`` maps a field name to that spelling (an environment variable, a Spark key).
    The values given are left out: a setting may be a secret.
    """

    def setting(loc: Sequence[int | str]) -> str:
        return f"setting {name_of('.'.join(str(p) for p in loc))}" if loc else "settings"

    return model.describe_problems(error, setting, inputs=False)


__all__ = [
    "SECRETS_DIR_ENV",
    "add_arguments",
    "describe_problems",
    "is_secret",
    "load_settings",
    "overrides_from_args",
    "secrets_dir",
]
