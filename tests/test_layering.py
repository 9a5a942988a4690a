"""The dependency rule of the layout, checked on the source: the core library
(``shared/icefloe``) imports nothing from the services (``services/icefloe``) and nothing
that speaks Kafka, HTTP or Spark, so it stays usable, and reviewable, on its own.

The layering between the service packages is import-linter's (``[tool.importlinter]`` in
pyproject.toml, run by ``make check``); these tests keep its contracts covering every package."""

from __future__ import annotations

import ast
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
