#!/usr/bin/env python3
"""Keep the core's tests in folders that mirror its packages (issue #21).

The core library is packages by concept (``shared/icefloe/<package>/``) plus three flat
cross-cutting modules (``errors``, ``retry``, ``events``). Its tests mirror that:
``tests/shared/<package>/test_<module>.py`` tests a module of ``icefloe.<package>``, and
``tests/shared/test_*.py`` is left for the tests of the flat modules and for the
cross-cutting tests that exercise several packages at once (interop with Java and PyIceberg,
for instance). This script moves every flat test that belongs in a package into it.

Usage, from anywhere (it works on the checkout it lives in, or ``--root``)::

    python3 tools/tests_mirror.py             # move and rewrite, leave it uncommitted
    python3 tools/tests_mirror.py --dry-run   # only list what it would move and rewrite
    python3 tools/tests_mirror.py --check     # exit 1 if one is out of place, naming where it goes
    python3 tools/tests_mirror.py --commit    # move, rewrite and commit that as one commit
    python3 tools/tests_mirror.py --readme    # README.md's references too (the lead's)

Where a flat ``tests/shared/test_<name>.py`` belongs, in order:

1. ``PLACES`` below, a small explicit table of the files the rules cannot decide.
2. Its name: the longest leading part of ``<name>`` (cut at underscores) that names a
   package (``scan``, ``manifest``), a module of one (``evaluators``), a package and module
   (``manifest_arrow``, ``catalog_fs``), a module and package (``keyed_table``) or a flat
   module (``events``). ``test_snapshot_producer_dv`` tests ``table.snapshot_producer``.
   When that part names modules of two packages (``values``: ``spec.values`` and
   ``arrow.values``), the file is ambiguous.
3. Otherwise its imports: the one package it imports besides the foundation everything
   imports (``spec`` and the flat modules), or ``spec`` if that is all it imports. A test that
   imports several packages is cross-cutting and ambiguous.

An ambiguous file makes a run fail, changing nothing, until it is added to ``PLACES``. The
package found must also be one the test imports (a name is a hint, the imports are the
evidence).

What a run does besides ``git mv``:

* Fixes the paths a moved test computes from its own location: ``Path(__file__).parent``,
  ``.parent.parent`` and ``.parents[N]`` become ``.parents[N + 1]`` (the test data under
  ``tests/fixtures`` stays where it is). Any other use of ``__file__`` stops the run: fix it
  by hand.
* Moves a helper module of ``tests/shared`` (``manifest_fixtures.py``) along with the tests
  that import it, when they all move to one folder; if they do not, the run stops. Tests are
  collected in pytest's default ``prepend`` import mode (no ``__init__.py``: each test's own
  folder and each conftest's folder go on ``sys.path``), so a test imports a helper by its
  bare name only from its own folder or from ``tests/`` (the root conftest's). The same holds
  for a test that imports another test. For the same reason basenames stay unique across
  ``tests/``: the script never renames a file, and refuses a move onto a name that exists.
* Rewrites references to moved files, ``tests/shared/test_x.py`` and ``tests.shared.test_x``,
  in the text files under ``shared/ services/ tests/ docs/ tools/`` and in ``mkdocs.yml
  pyproject.toml Makefile`` (``README.md`` only with ``--readme``). It rewrites a reference to
  any test that now lives in a package folder, not only to those it moved in this run, so a
  reference merged in later from another branch is fixed by running it again.

It is idempotent: a second run finds nothing to move or rewrite. ``--check`` also reports a
reference to a test's old path, and what a move cannot fix: a test folder under
``tests/shared`` that is not a core package, two test files with one basename, an import of a
test helper that does not resolve from the importer's folder, a data path computed from
``__file__`` that does not exist.
``tests/test_tests_layout.py`` runs ``--check`` in CI.
"""

from __future__ import annotations

import argparse
import ast
import functools
import io
import re
import subprocess
import sys
import tokenize
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

FLAT = ""  # a place: stays in tests/shared itself

# Files the rules cannot decide (or decide wrongly), each with the reason.
PLACES: dict[str, str] = {
    # Its name is both icefloe.table.catalog (the protocol) and the icefloe.catalog package;
    # it runs the protocol's contract against every catalog of icefloe.catalog.
    "test_catalog.py": "catalog",
    # icefloe.spec.values (Appendix D single values), not icefloe.arrow.values.
    "test_values.py": "spec",
    # A committer (table.snapshot_producer) with a manifest store (manifests.store) persists
    # decoded manifests that a planner's manifest cache reads: the store's contract, beside
    # test_decoded_writer.py, and sharing manifest_fixtures.py with the manifests tests.
    "test_commit_persists_decoded.py": "manifests",
    # Cross-cutting: whole tables through every package, read by the other engines.
    "test_interop_java.py": FLAT,
    "test_interop_pyiceberg.py": FLAT,
    # The per-file metrics evaluator (expressions) and the vectorized pruner (manifests)
    # must agree on -0.0 and +0.0: a test of the two packages together.
    "test_signed_zero.py": FLAT,
}

# Packages every test imports as building blocks: they say nothing about what it tests.
FOUNDATION = {"spec"}

TEXT_ROOTS = ("shared", "services", "tests", "docs", "tools")
TEXT_FILES = ("mkdocs.yml", "pyproject.toml", "Makefile")
TEXT_SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".txt", ".cfg", ".ini", ".sh", ".pyi"}

# Path(__file__), optionally resolved, then .parent repeated or .parents[N].
FILE_PATH = re.compile(
    r"Path\(__file__\)(?P<resolve>\.resolve\(\))?"
    r"(?:(?P<parents>(?:\.parent\b)+)|\.parents\[(?P<index>\d+)\])"
)


@dataclass(frozen=True)
class Core:
    """What the core's layout says about names: packages, their modules, the flat modules."""

    packages: dict[str, set[str]]  # package → its module names
    flat: set[str]  # errors, retry, events

    @classmethod
    def read(cls, root: Path) -> Core:
        core = root / "shared" / "icefloe"
        packages = {
            p.name: {m.stem for m in p.glob("*.py") if m.stem != "__init__"}
            for p in sorted(core.iterdir())
            if (p / "__init__.py").is_file()
        }
        return cls(packages, {p.stem for p in core.glob("*.py")})

    def names(self) -> dict[str, set[str]]:
        """Name part → the places it names (a package, or FLAT for a flat module)."""
        names: dict[str, set[str]] = defaultdict(set)
        for module in self.flat:
            names[module].add(FLAT)
        for package, modules in self.packages.items():
            forms = {package, package.removesuffix("s")}
            for form in forms:
                names[form].add(package)
            for module in modules:
                names[module].add(package)
                for form in forms:
                    names[f"{form}_{module}"].add(package)
                    names[f"{module}_{form}"].add(package)
        return names


@dataclass(frozen=True)
class Decision:
    place: str | None  # a package, FLAT, or None: ambiguous
    why: str


def imported_places(path: Path, core: Core) -> set[str]:
    """The core packages (and FLAT for a flat module) a test imports, anywhere in the file."""
    places = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            dotted = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in dotted:
            parts = name.split(".")
            if parts[0] != "icefloe" or len(parts) < 2:
                continue
            if parts[1] in core.packages:
                places.add(parts[1])
            elif parts[1] in core.flat:
                places.add(FLAT)
    return places


def decide(path: Path, core: Core) -> Decision:
    """Where a flat test belongs (see the module docstring for the rules)."""
    if path.name in PLACES:
        place = PLACES[path.name]
        return Decision(place, "by the table PLACES")
    imported = imported_places(path, core)
    parts = path.stem.removeprefix("test_").split("_")
    names = core.names()
    for end in range(len(parts), 0, -1):
        prefix = "_".join(parts[:end])
        if prefix not in names:
            continue
        places = names[prefix]
        if len(places) > 1:
            shown = ", ".join(sorted(p or "a flat module" for p in places))
            return Decision(None, f"its name ({prefix!r}) names modules of {shown}")
        (place,) = places
        where = f"icefloe.{place}" if place else f"icefloe.{prefix}"
        if place not in imported:
            return Decision(None, f"named after {where} but it does not import it")
        return Decision(place, f"by its name ({prefix!r}: {where})")
    subjects = {p for p in imported if p != FLAT} - FOUNDATION
    if not subjects and imported & FOUNDATION:
        subjects = imported & FOUNDATION
    if len(subjects) == 1:
        (place,) = subjects
        return Decision(place, f"by its imports (only icefloe.{place} besides the foundation)")
    shown = ", ".join(sorted(subjects)) or "no core package"
    return Decision(None, f"its name names no module and it imports {shown}")


def folder(root: Path, place: str) -> Path:
    shared = root / "tests" / "shared"
    return shared / place if place else shared


def rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\w+)[\w.]*[ \t]+import|import[ \t]+(\w+))", re.M)


@functools.cache
def bare_imports(path: Path) -> frozenset[str]:
    """Top-level names a file imports absolutely (``from x import``, ``import x``), at any
    depth: a line scan, not a parse (a parse of every test is seconds on a busy machine)."""
    return frozenset(a or b for a, b in IMPORT.findall(path.read_text()))


@dataclass
class Plan:
    """Moves (old → new path) and the reasons, decided before anything changes."""

    moves: dict[Path, Path]
    reasons: dict[Path, str]
    problems: list[str]


def plan(root: Path, core: Core) -> Plan:
    shared = root / "tests" / "shared"
    moves: dict[Path, Path] = {}
    reasons: dict[Path, str] = {}
    problems: list[str] = []
    for path in sorted(shared.glob("test_*.py")):
        decision = decide(path, core)
        if decision.place is None:
            problems.append(
                f"{rel(root, path)}: cannot tell which package it tests ({decision.why}); add "
                f"it to PLACES in tools/tests_mirror.py (a package, or FLAT if cross-cutting)"
            )
        elif decision.place and decision.place not in core.packages:
            problems.append(f"{rel(root, path)}: PLACES names {decision.place!r}, no package")
        elif decision.place:
            moves[path] = folder(root, decision.place) / path.name
            reasons[path] = decision.why
    # Helpers (and tests) that other tests import by bare name move with their importers.
    tests_root = root / "tests"
    after = {p: moves.get(p, p) for p in shared.rglob("*.py")}
    for module in sorted(p for p in shared.glob("*.py") if p.name != "conftest.py"):
        importers = {
            after[p].parent for p in after if p != module and module.stem in bare_imports(p)
        }
        home = after[module].parent
        if not importers or importers == {home}:
            continue
        if len(importers) == 1 and not module.name.startswith("test_"):
            (target,) = importers
            moves[module] = target / module.name
            reasons[module] = "a helper that only the tests of this folder import"
            continue
        shown = ", ".join(sorted(rel(root, d) + "/" for d in importers))
        problems.append(
            f"{rel(root, module)} is imported by bare name from {shown}, which do not all "
            f"sit in its folder: move it to tests/ (on sys.path through tests/conftest.py), "
            f"or decide the places of its importers in PLACES"
        )
    taken = {p.name: p for p in tests_root.rglob("*.py") if p.name != "conftest.py"}
    for old, new in moves.items():
        if new.exists() or taken.get(new.name, old) != old:
            problems.append(f"{rel(root, old)} → {rel(root, new)}: that name exists already")
    return Plan(moves, reasons, problems)


# Tokens that are text, not code: strings, comments, the literal parts of f-strings (3.12+).
STRING_TOKENS = {tokenize.STRING, tokenize.COMMENT} | {
    getattr(tokenize, name) for name in ("FSTRING_MIDDLE",) if hasattr(tokenize, name)
}


def string_spans(text: str) -> list[tuple[int, int]]:
    """Where the string literals and comments of a Python source are (offsets)."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in STRING_TOKENS:
            (row, col), (end_row, end_col) = token.start, token.end
            spans.append((starts[row - 1] + col, starts[end_row - 1] + end_col))
    return spans


def file_paths(text: str) -> list[re.Match[str]]:
    """The ``Path(__file__)...`` expressions of a source's code (not of its strings)."""
    if "__file__" not in text:
        return []
    spans = string_spans(text)
    return [
        match
        for match in FILE_PATH.finditer(text)
        if not any(start <= match.start() < end for start, end in spans)
    ]


def parent_index(match: re.Match[str]) -> int:
    """``.parent`` is ``.parents[0]``, ``.parent.parent`` is ``.parents[1]``..."""
    if match["parents"] is not None:
        return match["parents"].count(".parent") - 1
    return int(match["index"])


def fix_file_paths(text: str, levels: int) -> str:
    """``Path(__file__)...`` computed ``levels`` folders deeper now: point at the same place."""
    for match in reversed(file_paths(text)):
        fixed = f"Path(__file__){match['resolve'] or ''}.parents[{parent_index(match) + levels}]"
        text = text[: match.start()] + fixed + text[match.end() :]
    return text


def unfixable_file_uses(text: str) -> list[int]:
    """Lines that use ``__file__`` in a way ``fix_file_paths`` does not rewrite."""
    fixable = {match.start() + len("Path(") for match in file_paths(text)}
    return sorted(
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type == tokenize.NAME
        and token.string == "__file__"
        and offset(text, token.start) not in fixable
    )


def offset(text: str, position: tuple[int, int]) -> int:
    row, col = position
    return sum(len(line) for line in text.splitlines(keepends=True)[: row - 1]) + col


def text_files(root: Path, readme: bool) -> Iterable[Path]:
    listed = git(root, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    roots = tuple(f"{r}/" for r in TEXT_ROOTS)
    singles = set(TEXT_FILES) | ({"README.md"} if readme else set())
    for name in sorted(set(listed.split("\0")) - {""}):
        path = root / name
        if not path.is_file():
            continue
        if name in singles or (name.startswith(roots) and path.suffix in TEXT_SUFFIXES):
            yield path


def reference_rewrites(root: Path, extra: dict[Path, Path]) -> dict[str, str]:
    """Old reference → new, for every test in a package folder and every planned move."""
    shared = root / "tests" / "shared"
    placed = {
        shared / p.name: p
        for p in shared.glob("*/*.py")
        if not (shared / p.name).exists() and p.parent.name != "__pycache__"
    }
    placed.update(extra)
    rewrites = {}
    for old, new in placed.items():
        rewrites[rel(root, old)] = rel(root, new)
        rewrites[rel(root, old.with_suffix("")).replace("/", ".")] = rel(
            root, new.with_suffix("")
        ).replace("/", ".")
    return rewrites


def rewrite_references(text: str, rewrites: dict[str, str]) -> str:
    if not rewrites:
        return text
    pattern = re.compile(
        r"(?<![\w.])("
        + "|".join(re.escape(old) for old in sorted(rewrites, key=len)[::-1])
        + r")(?![\w])"
    )
    return pattern.sub(lambda m: rewrites[m[1]], text)


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout


def layout_problems(root: Path, core: Core) -> list[str]:
    """What a move cannot fix, for ``--check``: see the module docstring."""
    tests = root / "tests"
    shared = tests / "shared"
    problems = []
    for sub in sorted(p for p in shared.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if sub.name not in core.packages:
            problems.append(
                f"{rel(root, sub)}/: no core package icefloe.{sub.name} (tests/shared/<package>/ "
                f"mirrors shared/icefloe/<package>/)"
            )
    files = sorted(p for p in tests.rglob("*.py") if "__pycache__" not in p.parts)
    by_name: dict[str, list[Path]] = defaultdict(list)
    for path in files:
        if path.name not in {"conftest.py", "__init__.py"}:
            by_name[path.stem].append(path)
    for stem, paths in sorted(by_name.items()):
        if len(paths) > 1:
            shown = ", ".join(rel(root, p) for p in paths)
            problems.append(
                f"{stem}.py twice ({shown}): tests are imported by basename (pytest's prepend "
                f"mode, no __init__.py), so one would shadow the other; rename one"
            )
    conftest_dirs = {p.parent for p in files if p.name == "conftest.py"}
    for path in files:
        # The folders on sys.path when this file runs alone: its own and its conftests'.
        reach = {path.parent} | {d for d in conftest_dirs if d in path.parents}
        for name in sorted(bare_imports(path)):
            homes = [p.parent for p in by_name.get(name, [])]
            if homes and not set(homes) & reach:
                problems.append(
                    f"{rel(root, path)} imports {name}, which is in "
                    f"{', '.join(rel(root, h) + '/' for h in homes)}: not on sys.path when it "
                    f"runs alone (put the importer beside it, or the helper in tests/)"
                )
        text = path.read_text()
        for match in file_paths(text):
            base = path.resolve().parents[parent_index(match)]
            tail = re.match(r'((?:\s*/\s*"[^"{}]*")+)', text[match.end() :])
            if tail:
                target = base.joinpath(*re.findall(r'"([^"]*)"', tail[1]))
                if not target.exists():
                    shown = rel(root, target) if target.is_relative_to(root) else str(target)
                    problems.append(
                        f"{rel(root, path)} opens {shown}, which does not exist "
                        f"(a path computed from __file__ before a move?)"
                    )
    return problems


def planned_edits(root: Path, the_plan: Plan, readme: bool) -> dict[Path, str]:
    """File → its new text: references to moved tests rewritten, moved tests' paths fixed."""
    rewrites = reference_rewrites(root, the_plan.moves)
    edits: dict[Path, str] = {}
    for path in text_files(root, readme):
        text = path.read_text()
        new_text = rewrite_references(text, rewrites)
        if path in the_plan.moves:
            levels = len(the_plan.moves[path].parts) - len(path.parts)
            new_text = fix_file_paths(new_text, levels)
        if new_text != text:
            edits[path] = new_text
    return edits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if a test is out of place")
    mode.add_argument("--dry-run", action="store_true", help="list what a run would do")
    mode.add_argument("--commit", action="store_true", help="commit the result as one commit")
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's references")
    args = parser.parse_args()
    root: Path = args.root.resolve()
    core = Core.read(root)
    the_plan = plan(root, core)

    if args.check:
        problems = list(the_plan.problems)
        for old, new in the_plan.moves.items():
            problems.append(
                f"{rel(root, old)} belongs in {rel(root, new.parent)}/ "
                f"({the_plan.reasons[old]}): run python3 tools/tests_mirror.py"
            )
        problems += [
            f"{rel(root, path)} refers to a test by its old path: run python3 tools/tests_mirror.py"
            for path in planned_edits(root, the_plan, args.readme)
            if path not in the_plan.moves
        ]
        problems += layout_problems(root, core)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0

    if the_plan.problems:
        print(
            "tests_mirror: nothing changed:\n  " + "\n  ".join(the_plan.problems), file=sys.stderr
        )
        return 1
    unfixable = [
        f"{rel(root, old)}: line {line}"
        for old in the_plan.moves
        for line in unfixable_file_uses(old.read_text())
    ]
    if unfixable:
        print(
            "tests_mirror: nothing changed: these use __file__ in a way the script does not "
            "rewrite (only Path(__file__)[.resolve()].parent... / .parents[N]):\n  "
            + "\n  ".join(unfixable),
            file=sys.stderr,
        )
        return 1
    if args.commit and git(root, "diff", "--cached", "--name-only").strip():
        print(
            "tests_mirror: something is staged already; commit or unstage it first", file=sys.stderr
        )
        return 1

    edits = planned_edits(root, the_plan, args.readme)
    for old, new in the_plan.moves.items():
        print(f"move {rel(root, old)} → {rel(root, new)}  ({the_plan.reasons[old]})")
    for path in edits:
        print(f"rewrite {rel(root, path)}")
    if args.dry_run or not (the_plan.moves or edits):
        if not (the_plan.moves or edits):
            print("tests_mirror: every test is in place")
        return 0

    tracked_before = set(git(root, "ls-files", "-z").split("\0"))
    for path, text in edits.items():
        path.write_text(text)
    changed = []
    for old, new in the_plan.moves.items():
        new.parent.mkdir(exist_ok=True)
        if git(root, "ls-files", "--", rel(root, old)).strip():
            git(root, "mv", rel(root, old), rel(root, new))
        else:  # an untracked new test: move it, leave it untracked
            old.rename(new)
        if rel(root, old) in tracked_before:
            changed.append(new)
    changed += [the_plan.moves.get(p, p) for p in edits if rel(root, p) in tracked_before]
    if args.commit:
        tracked = [rel(root, p) for p in changed]
        git(root, "add", "--", *tracked)
        moved = len(the_plan.moves)
        git(
            root,
            "commit",
            "-q",
            "-m",
            f"Tests mirror the core's packages: {moved} files of tests/shared moved into "
            f"tests/shared/<package>/, references rewritten (made by tools/tests_mirror.py alone)",
        )
        print(git(root, "log", "-1", "--format=%h %s"), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
