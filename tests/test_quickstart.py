"""The quickstart of the documentation site, run as a reader would run it.

``docs/quickstart.md`` promises that every command and program on it works as written. This
test takes its fenced blocks in order: ``bash`` blocks are the reader's commands, blocks
with a ``title="FILE"`` are files the reader saves in the working directory, and a ``text``
block shows (some of) the output of the ``bash`` block before it, ``...`` standing for what
differs from run to run. Every block is one of these, so a new command cannot slip past.

How it runs, as close to the page as a test can:

* ``make demo`` from the repository root, made small by ``DEMO_ARGS`` (an environment
  variable make reads, which the page mentions): the demo's full million rows take minutes.
* Every later command in one bash script, in the order of the page, with ``set -euo
  pipefail``, from the repository root, with ``HOME`` a fresh directory (the page works in
  ``~/icefloe-quickstart``), no ``ICEFLOE_*`` variables of the test run, and in a network
  namespace of its own (``unshare --net``, which needs root, as the whole set-up does):
  the page starts the services on their default ports, 9464 and 8181, and there no other
  process on the machine can hold them.
* The page's last command stops what it started; the test waits until no process of the
  script's process group is left (so a service that ignored SIGTERM would hang the test
  until pytest-timeout's ceiling reports it), and kills the group if the test fails early.

The demo (one Spark session) and the quickstart's two Spark jobs (a JVM each) dominate
its time. On 2 cores shared with five other test runs (load 8-15) it took 7-9.6 minutes
(``make demo`` 218 s, the rest 357 s in the slower run); most of it is the JVMs starting.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
PAGE = REPO_ROOT / "docs" / "quickstart.md"
WORKDIR = "icefloe-quickstart"  # under HOME, as the page says
DEMO_ARGS = "--rows 5000 --writers 1 --batches 1 --batch-rows 500"

_FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class Block:
    language: str
    title: str | None
    body: str


def blocks(page: str) -> list[Block]:
    found = []
    for match in _FENCE.finditer(page):
        title = re.search(r'title="([^"]+)"', match[2])
        found.append(Block(match[1], title[1] if title else None, match[3]))
    return found


@dataclass(frozen=True, slots=True)
class Step:
    """A bash block and the output lines the page shows for it."""

    commands: str
    expected: list[str]


def steps_and_files(page: str) -> tuple[list[Step], dict[str, str]]:
    steps: list[Step] = []
    files: dict[str, str] = {}
    for block in blocks(page):
        if block.title is not None:
            files[block.title] = block.body
        elif block.language == "bash":
            steps.append(Step(block.body, []))
        elif block.language == "text":
            assert steps and not steps[-1].expected, "a text block follows no command"
            steps[-1] = Step(steps[-1].commands, block.body.splitlines())
        else:
            raise AssertionError(f"a {block.language or 'plain'} block the test cannot run")
    return steps, files


def check_output(step: Step, output: str) -> None:
    lines = output.splitlines()
    for expected in step.expected:
        pattern = ".*".join(re.escape(part) for part in expected.split("..."))
        assert any(re.fullmatch(pattern, line) for line in lines), (
            f"the page shows {expected!r} after\n{step.commands}\nbut the output was:\n{output}"
        )


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ICEFLOE_", "VIRTUAL_ENV"))}
    env["HOME"] = str(home)
    return env


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _logs(workdir: Path) -> str:
    return "\n".join(
        f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-3000:]}"
        for log in sorted(workdir.glob("*.log"))
    )


def test_the_page_is_made_of_runnable_blocks() -> None:
    steps, files = steps_and_files(PAGE.read_text())
    assert steps[0].commands.strip() == "make demo"
    assert {"orders.json", "write_orders.py", "read_duckdb.py", "read_pyiceberg.py"} <= set(files)
    for name in files:
        assert any(name in step.commands for step in steps), f"{name} is saved but never used"
    assert sum(1 for step in steps if step.expected) >= 5


@pytest.mark.integration
def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    steps, files = steps_and_files(PAGE.read_text())
    home = tmp_path / "home"
    workdir = home / WORKDIR
    workdir.mkdir(parents=True)
    for name, text in files.items():
        (workdir / name).write_text(text)
    env = _environment(home)

    demo, rest = steps[0], steps[1:]
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{demo.commands}"],
        cwd=REPO_ROOT,
        env={**env, "DEMO_ARGS": DEMO_ARGS},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert "demo succeeded" in result.stdout
    demo_s = time.monotonic() - started

    # One script, each step's output led by a marker line so it can be told apart.
    script = ["set -euo pipefail"]
    for number, step in enumerate(rest):
        script += [f"echo '@@step {number}@@'", step.commands]
    (tmp_path / "quickstart.sh").write_text("\n".join(script) + "\n")
    process = subprocess.Popen(
        [
            "unshare",
            "--net",
            "bash",
            "-c",
            f"ip link set lo up && exec bash {tmp_path}/quickstart.sh",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate()
        assert process.returncode == 0, f"{output[-8000:]}\n{_logs(workdir)}"
        # The page's last step stopped everything: wait for the processes to go.
        while _group_alive(process.pid):
            time.sleep(0.2)
    finally:
        if _group_alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
    print(
        f"quickstart: make demo {demo_s:.0f} s, the rest {time.monotonic() - started - demo_s:.0f} s"
    )
    parts = re.split(r"^@@step (\d+)@@$", output, flags=re.MULTILINE)
    outputs = {int(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}
    assert sorted(outputs) == list(range(len(rest)))
    for number, step in enumerate(rest):
        check_output(step, outputs[number])
