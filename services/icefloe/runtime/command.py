"""Running a command-line entry point, and the exit statuses every icefloe command keeps.

| status | meaning |
|---|---|
| 0 | success; for a service, a clean stop after SIGTERM or SIGINT |
| 1 | an error, named on one ``icefloe: error: ...`` line on stderr (bad settings, a store or broker that cannot be reached, invalid input, a service that stopped on a failure) |
| 2 | a usage error: argparse's usage and its ``icefloe: error: ...`` line |
| 130 | interrupted (Ctrl-C) before a clean stop |

Parsers are :class:`ArgumentParser`: every flag's help shows its default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from icefloe.errors import IcefloeError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

log = logging.getLogger("icefloe.command")


class HelpFormatter(argparse.HelpFormatter):
    """Adds ``(default: ...)`` to a flag's help when it has a default worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        shown = default not in (None, False, argparse.SUPPRESS) and default != []
        takes_value = action.option_strings and action.nargs != 0
        if shown and takes_value and "%(default)" not in text and "default" not in text:
            text += " (default: %(default)s)"
        return text


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with :class:`HelpFormatter`; its subcommands' parsers are too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def run_command(command: Coroutine[Any, Any, int]) -> int:
    """Run ``command`` to completion: its exit status, or 1 after one error line (see the
    module docstring); an unexpected failure's traceback goes to the log first."""
    try:
        return asyncio.run(command)
    except (IcefloeError, OSError, json.JSONDecodeError) as e:
        print(f"icefloe: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("icefloe: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        log.exception("unexpected failure")
        print(f"icefloe: error: unexpected {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ERROR
