"""How many examples a property test runs, relative to the loaded Hypothesis profile.

A test that needs another number of examples than the profile's says so with
``@settings(max_examples=examples(N))``, never with a bare ``N``: a number written on a test
overrides every profile, so the smaller ``fast`` profile of ``make test-fast`` would not
shrink it, and the fast tier would spend most of its time in the few tests that ask for
hundreds. ``N`` is the count under the full profiles (``dev`` and ``ci``, 100 examples by
default), so ``make test`` runs exactly ``N``; the fast profile scales it in proportion.
"""

from __future__ import annotations

from hypothesis import settings

# The default max_examples of the full profiles, which the numbers in tests are written for.
FULL_PROFILE_EXAMPLES = 100


def examples(full: int) -> int:
    """``full`` under the full profiles, scaled to the loaded profile (at least one)."""
    return max(1, round(full * settings.default.max_examples / FULL_PROFILE_EXAMPLES))
