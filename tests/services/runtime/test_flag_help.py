"""Every settings flag says what it does and what its default is."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from icefloe.coordinator.config import add_arguments as add_coordinator_arguments
from icefloe.planner.config import add_arguments as add_planner_arguments


@pytest.mark.parametrize("add", [add_coordinator_arguments, add_planner_arguments])
def test_every_flag_names_its_default_and_variable(
    add: Callable[[argparse.ArgumentParser], None],
) -> None:
    parser = argparse.ArgumentParser()
    add(parser)
    for action in parser._actions:
        if action.dest == "help":
            continue
        text = action.help or ""
        assert "(env ICEFLOE_" in text, f"--{action.dest}: {text!r}"
        assert any(word in text for word in ("default", "unset", "required")), (
            f"--{action.dest} does not say its default: {text!r}"
        )
