"""The dependency rule of the layout, checked on the source: the core library
(``shared/icefloe``) imports nothing from the services (``services/icefloe``) and nothing
that speaks Kafka, HTTP or Spark, so it stays usable, and reviewable, on its own."""

from __future__ import annotations

import ast
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


def test_core_imports_no_service_module_and_no_service_library() -> None:
    service_modules = {f"icefloe.{p.stem}" for p in SERVICES.glob("*.py")}
    service_modules |= {f"icefloe.{p.name}" for p in SERVICES.iterdir() if p.is_dir()}
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
