"""A planner process pays its lazy imports before it opens its port, not on a request.

Arrow converts a Python scalar argument of a compute function through its pandas shim,
which imports pandas the first time (most of a second on a loaded machine). Run in a fresh
interpreter, since this one may have imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
from icefloe.planner.serving import _warm_up
_warm_up()
before = set(sys.modules)
import pyarrow as pa, pyarrow.compute as pc
status = pa.array([0, 1, 2], pa.int32())
pc.not_equal(status, 2)
pc.equal(pa.array(["a", "b"]), "a")
pc.less_equal(pa.array([1, 5], pa.int64()), 3)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_after_the_warm_up_a_plans_compute_calls_import_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], check=True, capture_output=True, text=True
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_without_it_the_first_compute_call_imports_pandas() -> None:
    """The cost the warm-up moves (if this fails, Arrow stopped importing pandas lazily and
    the warm-up may go)."""
    script = SCRIPT.replace("_warm_up()", "")
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True
    ).stdout
    assert "pandas" in json.loads(out.strip().splitlines()[-1])
