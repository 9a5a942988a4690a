"""The fast tier stays fast: its property tests take their example counts from the profile."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import settings

from hypothesis_budget import examples

TESTS = Path(__file__).resolve().parent
# Every test: a bare count would ignore the fast profile of `make test-fast`, and a test
# moved into the fast tier later would bring its bare count with it.
EVERY_TEST = [TESTS]
BARE_COUNT = re.compile(r"\bmax_examples\s*=\s*\d")


def test_property_tests_ask_for_examples_through_the_budget() -> None:
    bare = [
        f"{path.relative_to(TESTS)}:{number}"
        for root in EVERY_TEST
        for path in sorted(root.rglob("test_*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if BARE_COUNT.search(line)
    ]
    assert not bare, "write max_examples=examples(N), not a bare N:\n" + "\n".join(bare)


def test_budget_is_proportional_to_the_loaded_profile() -> None:
    scale = settings.default.max_examples / 100
    assert examples(100) == settings.default.max_examples
    assert examples(300) == round(300 * scale)
    assert examples(1) == 1  # never zero
