"""The dependency rule of the layout, checked on the source: the core library
(``shared/icefloe``) imports nothing from the services (``services/icefloe``) and nothing
that speaks Kafka, HTTP or Spark, so it stays usable, and reviewable, on its own.

The layering between the core's packages, and between the service packages, is
import-linter's (``[tool.importlinter]`` in pyproject.toml, run by ``make check``); these
tests keep its contracts covering every package, and find import cycles anywhere in shipped code
(core and services, through imports inside functions and under ``TYPE_CHECKING`` too)."""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "shared" / "icefloe"
SERVICES = ROOT / "services" / "icefloe"
# Third-party packages that belong to services: brokers, HTTP servers and clients, Spark.
SERVICE_ONLY = {"aiokafka", "kafka", "aiohttp", "requests", "pyspark", "prometheus_client"}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-local imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def service_top_level_names() -> set[str]:
    """The names the services root adds to the ``icefloe`` namespace: packages and modules."""
    names = {p.stem for p in SERVICES.glob("*.py")}
    names |= {p.name for p in SERVICES.iterdir() if p.is_dir() and p.name != "__pycache__"}
    return names


def test_core_imports_no_service_module_and_no_service_library() -> None:
    service_modules = {f"icefloe.{name}" for name in service_top_level_names()}
    core_files = sorted(CORE.rglob("*.py"))
    assert core_files, "no core modules found"
    problems = []
    for path in core_files:
        for name in sorted(imported_modules(path)):
            top = name.split(".")[0]
            owner = ".".join(name.split(".")[:2])
            if owner in service_modules or top in SERVICE_ONLY:
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not problems, "the core must not depend on services:\n" + "\n".join(problems)


def test_no_module_name_is_in_both_source_roots() -> None:
    """One namespace over two roots: a name in both would shadow one with the other."""
    core = {p.relative_to(CORE) for p in CORE.rglob("*.py")}
    services = {p.relative_to(SERVICES) for p in SERVICES.rglob("*.py")}
    assert not (core & services), sorted(str(p) for p in core & services)


def test_no_service_package_shadows_a_core_module() -> None:
    """``icefloe.coordinator`` (a package) and a core ``icefloe/coordinator.py`` would clash."""
    core = {p.stem for p in CORE.glob("*.py")} | {p.name for p in CORE.iterdir() if p.is_dir()}
    assert not (core & service_top_level_names()), sorted(core & service_top_level_names())


def test_the_import_contracts_cover_every_service_package() -> None:
    """A new service package must be placed in the contracts, or the core could import it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (protected,) = [c for c in config["contracts"] if c["type"] == "protected"]
    assert set(protected["protected_modules"]) == {
        f"icefloe.{name}" for name in service_top_level_names()
    }


def modules_under(root: Path) -> dict[str, Path]:
    """Dotted name → file of every module under a source root (a package is its
    ``__init__.py``)."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(("icefloe", *parts))] = path
    return modules


def shipped_modules() -> dict[str, Path]:
    """Dotted name → file of every module of both roots, the core and the services."""
    return {**modules_under(CORE), **modules_under(SERVICES)}


def core_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The core modules ``name`` imports, anywhere in the file: top level, inside functions
    and under ``if TYPE_CHECKING``. ``from icefloe.x import y`` counts as importing the
    submodule ``icefloe.x.y`` when there is one, else ``icefloe.x``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            candidates = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


def import_cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: set[tuple[str, ...]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.add(tuple(sorted(component)))
    return cycles


@functools.cache
def shipped_import_graph() -> dict[str, set[str]]:
    """Module → the modules of either root it imports (parsed once per test session)."""
    modules = shipped_modules()
    return {name: core_imports(name, path, modules) for name, path in modules.items()}


def test_shipped_modules_import_each_other_without_cycles() -> None:
    """Dependencies point one way, in the core (types below values below expressions below
    evaluators, ...) and in the services alike. A cycle, even through an import inside a
    function, means two modules share a piece that belongs in a third: move it there rather
    than hide the cycle."""
    graph = shipped_import_graph()
    assert any(name.startswith("icefloe.coordinator") for name in graph), "services not found"
    assert "icefloe.spec.schema" in graph, "core modules not found"
    new = import_cycles(graph)
    shown = [
        " ↔ ".join(cycle)
        + ": "
        + "; ".join(f"{a} → {b}" for a in cycle for b in sorted(graph[a] & set(cycle)))
        for cycle in sorted(new)
    ]
    assert not new, "import cycles in shipped code:\n" + "\n".join(shown)


# The modules that stay at the top of the core: the cross-cutting ones. Everything else
# lives in a package named after its concept (spec, io, manifests, scan, table, catalog...).
CROSS_CUTTING = {"errors", "retry", "events"}


def test_the_core_is_packages_by_concept() -> None:
    """A newcomer opening ``shared/icefloe/`` sees the concepts as packages: a new module
    goes into the package of its concept, not beside them."""
    flat = {p.stem for p in CORE.glob("*.py")}
    assert flat == CROSS_CUTTING, f"place these in a package: {sorted(flat - CROSS_CUTTING)}"
    packages = {p.name for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert all((CORE / name / "__init__.py").is_file() for name in packages), sorted(packages)


def test_the_core_layers_contract_places_every_core_package() -> None:
    """The core's packages import downwards only (import-linter); a package the contract
    does not name would escape it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [
        c["layers"]
        for c in config["contracts"]
        if c["type"] == "layers" and "containers" not in c and "icefloe.spec" in str(c)
    ]
    named = {part.strip() for layer in layers for part in layer.replace(":", "|").split("|")}
    top = {f"icefloe.{p.stem}" for p in CORE.glob("*.py")}
    top |= {f"icefloe.{p.name}" for p in CORE.iterdir() if (p / "__init__.py").is_file()}
    assert named == top, f"not in the contract: {sorted(top - named)}; gone: {sorted(named - top)}"


def test_cycle_finder_sees_cycles_through_function_local_imports(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import icefloe.b\n")
    (tmp_path / "b.py").write_text("def f() -> None:\n    from icefloe.c import thing\n")
    (tmp_path / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from icefloe import a\n"
    )
    (tmp_path / "d.py").write_text("from icefloe.a import x\n")
    modules = {f"icefloe.{p.stem}": p for p in tmp_path.glob("*.py")}
    graph = {name: core_imports(name, path, modules) for name, path in modules.items()}
    assert graph["icefloe.c"] == {"icefloe.a"}
    assert import_cycles(graph) == {("icefloe.a", "icefloe.b", "icefloe.c")}
