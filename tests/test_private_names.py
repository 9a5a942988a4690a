"""No private name crosses a module boundary in shipped code.

A leading underscore says "this module's own business": a private helper another module
imports (``from icefloe.spark.writer import _delete``) or reaches through a module
(``writer._delete``) is a shared piece with no owner, and it changes under the importer's
feet. Give it a public name in the module it belongs to (often a new one, as the Spark job
staging protocol got :mod:`icefloe.spark.staging`). The check reads the source, so it sees
imports inside functions too.

Import cycles, in the services as in the core, are :mod:`test_layering`'s.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = (ROOT / "shared" / "icefloe", ROOT / "services" / "icefloe")


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_names(roots: tuple[Path, ...]) -> dict[str, Path]:
    """Dotted name → file of every module under ``roots`` (a package is its ``__init__``)."""
    modules = {}
    for root in roots:
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(("icefloe", *parts))] = path
    return modules


def absolute(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    parts = package.split(".")
    anchor = parts[: len(parts) - node.level + 1]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def private_crossings(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """Where ``path`` imports another module's private name or reaches into a module for one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    module_aliases: set[str] = set()  # local names bound to icefloe modules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = absolute(node, name, path)
            if not source.startswith("icefloe"):
                continue
            for alias in node.names:
                if is_private(alias.name):
                    found.append(f"line {node.lineno}: from {source} import {alias.name}")
                elif f"{source}.{alias.name}" in modules:
                    module_aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("icefloe"):
                    module_aliases.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
            continue
        chain = [node.attr]
        value = node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in module_aliases:
            found.append(f"line {node.lineno}: {'.'.join([value.id, *reversed(chain)])}")
    return found


def test_no_private_name_crosses_a_module_boundary() -> None:
    modules = module_names(SOURCE_ROOTS)
    assert modules, "no shipped modules found"
    problems = [
        f"{path.relative_to(ROOT)} {where}"
        for name, path in sorted(modules.items())
        for where in private_crossings(name, path, modules)
    ]
    assert not problems, (
        "private names used across modules (give each a public name in the module that owns "
        "it, or move it where both users can import it):\n" + "\n".join(problems)
    )


def test_the_check_sees_imports_and_module_attributes(tmp_path: Path) -> None:
    root = tmp_path / "icefloe"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "a.py").write_text("_hidden = 1\nshown = 2\n")
    (root / "pkg" / "b.py").write_text(
        "from icefloe.pkg.a import _hidden, shown\n"
        "from icefloe.pkg import a\n"
        "import icefloe.pkg.a as aa\n"
        "def f() -> None:\n"
        "    from .a import _hidden as h\n"
        "    print(a._hidden, aa._hidden, a.shown, a.__name__, shown._private)\n"
    )
    modules = module_names((root,))
    found = private_crossings("icefloe.pkg.b", root / "pkg" / "b.py", modules)
    assert sorted(found) == sorted(
        [
            "line 1: from icefloe.pkg.a import _hidden",
            "line 5: from icefloe.pkg.a import _hidden",
            "line 6: a._hidden",
            "line 6: aa._hidden",
        ]
    )
