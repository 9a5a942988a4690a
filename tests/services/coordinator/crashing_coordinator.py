"""The coordinator with a crash point, for tests: it dies at a commit stage as ``kill -9`` would.

``python tests/services/coordinator/crashing_coordinator.py --crash-at STAGE [--crash-after N]
[coordinator flags]`` runs ``python -m icefloe.coordinator`` with a :class:`CommitHooks` that
lets the stage pass N times and then ends the process at once with status 137, so tests can
prove the exactly-once protocol across a death at each step. The shipped coordinator has no
such switch: its hooks do nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from icefloe.coordinator.commit_hooks import COMMIT_STAGES, CommitHooks
from icefloe.coordinator.service import main as coordinator_main

CRASH_EXIT_STATUS = 137
PATH = os.path.abspath(__file__)

log = logging.getLogger("icefloe.tests.crash")


class ExitAt(CommitHooks):
    """Pass ``stage`` ``after`` times, then exit with status 137 the next time."""

    def __init__(self, stage: str, after: int = 0) -> None:
        if stage not in COMMIT_STAGES:
            raise ValueError(f"{stage!r} is not a commit stage; use one of {COMMIT_STAGES}")
        if after < 0:
            raise ValueError(f"--crash-after {after} must not be negative")
        self.stages = frozenset({stage})
        self.stage = stage
        self.after = after
        self.passed = 0

    def on_stage(self, stage: str) -> None:
        if stage != self.stage:
            return
        if self.passed < self.after:
            self.passed += 1
            return
        log.critical("crash point %s reached: exiting with status %d", stage, CRASH_EXIT_STATUS)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(CRASH_EXIT_STATUS)


def command(crash_at: str, crash_after: int, flags: Sequence[str]) -> list[str]:
    """The command line that runs the coordinator with ``flags``, dying at ``crash_at``."""
    return [sys.executable, PATH, "--crash-at", crash_at, "--crash-after", str(crash_after), *flags]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--crash-at", required=True, choices=COMMIT_STAGES)
    parser.add_argument("--crash-after", type=int, default=0)
    ours, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return coordinator_main(rest, hooks=ExitAt(ours.crash_at, ours.crash_after))


if __name__ == "__main__":
    sys.exit(main())
