"""Running a command-line entry point: exit status 0 on success, and 1 with one
``icefloe: error: ...`` line naming the problem on bad input."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine
from typing import Any

from icefloe.errors import IcefloeError


def run_command(command: Coroutine[Any, Any, int]) -> int:
    """Run ``command`` to completion; its exit status, or 1 after printing the error."""
    try:
        return asyncio.run(command)
    except (IcefloeError, OSError, json.JSONDecodeError) as e:
        print(f"icefloe: error: {e}", file=sys.stderr)
        return 1
