"""The core's tests mirror its packages: ``tests/shared/<package>/test_<module>.py``.

``tools/tests_mirror.py --check`` says where each misplaced test belongs; CI runs it here, so
a new flat ``tests/shared/test_x.py`` for a module of a package fails with the folder it
belongs in (``python3 tools/tests_mirror.py`` moves it). The other tests run the script on
a small checkout of its own, to show it moves what it should, fixes what a move breaks,
refuses what it cannot decide, and changes nothing the second time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "tests_mirror.py"


def mirror(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_core_test_is_in_the_folder_of_its_package() -> None:
    result = mirror(ROOT, "--check")
    assert result.returncode == 0, "tests out of place:\n" + result.stderr


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def checkout(tmp_path: Path) -> Path:
    """A checkout with a core of two packages (``scan``, ``spec``) and ``arrow``, flat tests."""
    root = tmp_path / "repo"
    write(
        root,
        {
            "shared/icefloe/errors.py": "",
            "shared/icefloe/scan/__init__.py": "",
            "shared/icefloe/scan/planning.py": "",
            "shared/icefloe/spec/__init__.py": "",
            "shared/icefloe/spec/values.py": "",
            "shared/icefloe/arrow/__init__.py": "",
            "shared/icefloe/arrow/values.py": "",
            "tests/conftest.py": "",
            "tests/fixtures/plan.json": "{}",
            "tests/shared/plan_helpers.py": "HELP = 1\n",
            "tests/shared/test_planning.py": (
                "from pathlib import Path\n"
                "from plan_helpers import HELP\n"
                "from icefloe.scan.planning import plan\n"
                'DATA = Path(__file__).resolve().parent.parent / "fixtures" / "plan.json"\n'
            ),
            "tests/shared/test_errors.py": "from icefloe.errors import ValidationError\n",
            "docs/testing.md": "See tests/shared/test_planning.py::test_x and test_planning.\n",
        },
    )
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def test_a_flat_test_of_a_package_is_named_with_its_folder_and_moved_once(
    tmp_path: Path,
) -> None:
    root = checkout(tmp_path)
    check = mirror(root, "--check")
    assert check.returncode == 1
    assert "tests/shared/test_planning.py belongs in tests/shared/scan/" in check.stderr
    assert "test_errors.py" not in check.stderr  # a flat module's test stays flat

    assert mirror(root).returncode == 0
    moved = root / "tests" / "shared" / "scan" / "test_planning.py"
    assert not (root / "tests" / "shared" / "test_planning.py").exists()
    assert 'Path(__file__).resolve().parents[2] / "fixtures"' in moved.read_text()
    assert (root / "tests" / "shared" / "scan" / "plan_helpers.py").is_file()  # with its user
    assert (root / "tests" / "shared" / "test_errors.py").is_file()
    docs = (root / "docs" / "testing.md").read_text()
    assert docs == "See tests/shared/scan/test_planning.py::test_x and test_planning.\n"

    again = mirror(root)
    assert again.returncode == 0 and "every test is in place" in again.stdout
    assert mirror(root, "--check").returncode == 0


def test_an_ambiguous_test_is_refused_until_placed_by_hand(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    write(root, {"tests/shared/test_values_order.py": "from icefloe.spec.values import x\n"})
    check = mirror(root, "--check")
    assert check.returncode == 1
    assert "tests/shared/test_values_order.py: cannot tell which package" in check.stderr
    assert "names modules of arrow, spec" in check.stderr
    run = mirror(root)
    assert run.returncode == 1 and "nothing changed" in run.stderr
    assert (root / "tests" / "shared" / "test_planning.py").is_file()


def test_the_check_finds_what_a_move_breaks(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    assert mirror(root).returncode == 0
    write(
        root,
        {
            "tests/shared/spec/test_planning.py": "",  # a basename twice
            "tests/shared/spec/test_values.py": (
                "from pathlib import Path\n"
                "from plan_helpers import HELP\n"  # in scan/: not on sys.path from spec/
                'DATA = Path(__file__).parents[1] / "fixtures" / "plan.json"\n'  # no such file
            ),
            "tests/shared/planning/test_plans.py": "",  # not a core package
            "docs/more.md": "tests/shared/test_errors.py, tests/shared/test_planning.py\n",
        },
    )
    problems = mirror(root, "--check").stderr
    assert "test_planning.py twice" in problems
    assert "tests/shared/spec/test_values.py imports plan_helpers" in problems
    assert "opens tests/shared/fixtures/plan.json, which does not exist" in problems
    assert "tests/shared/planning/: no core package icefloe.planning" in problems
    assert "docs/more.md refers to a test by its old path" in problems  # merged in later
