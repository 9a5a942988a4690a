"""``make bench``: icefloe's figures beside a named peer measured in the same run.

An absolute throughput says little: the same code is twice as fast on another machine, or
half as fast while a test suite runs next to it. A ratio against a peer doing the same work,
on the same records, seconds apart, in the same process, survives both, so every figure here
carries at least one peer and the report prints the ratio next to the numbers.

Benchmarks live in their own modules and register themselves::

    @benchmark("manifest")
    def manifest_benchmark(ctx: BenchContext) -> list[Figure]:
        n = ctx.size("entries", full=100_000, quick=10_000)
        ...
        return [Figure("write", "entries/s", icefloe=ctx.measure(...), peers={...})]

and are made known to the runner by one line in :data:`BENCHMARK_MODULES`. A module that
cannot be imported (an optional engine is not installed) is reported, not fatal, so one
missing peer never hides the other figures. A benchmark may be a coroutine function; it then
runs in its own event loop.

Timing uses :func:`time.perf_counter`. Each measurement warms up once (imports, schema caches,
allocator) and then runs ``repeat`` times. Before each run the heap is collected and frozen,
so neither the previous run's garbage nor the other implementations' inputs are scanned on
this run's clock. The report shows the best run (the one least disturbed by whatever else
the machine was doing) and the JSON output keeps every run.

Usage: ``python -m icefloe.dev.bench [--only NAME] [--quick] [--repeat N] [--set NAME=VALUE]
[--json FILE] [--profile] [--list]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib
import inspect
import io
import json
import math
import os
import platform
import pstats
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from importlib import metadata
from typing import Any, TypeVar

from icefloe.errors import ValidationError

# One line per benchmark module; importing a module registers its benchmarks.
BENCHMARK_MODULES: tuple[str, ...] = (
    "icefloe.dev.bench_manifest",
    "icefloe.dev.bench_commits",
    "icefloe.dev.bench_planner",
    "icefloe.dev.bench_commit_path",
    "icefloe.dev.bench_planner_service",
    "icefloe.dev.bench_planner_hostile",
    "icefloe.dev.bench_planner_memory",
    "icefloe.dev.bench_spark",
    "icefloe.dev.bench_compact",
    "icefloe.dev.bench_coordinator",
    "icefloe.dev.bench_dedup",
    "icefloe.dev.bench_key_index",
    "icefloe.dev.bench_upsert",
    "icefloe.dev.bench_java_merge",
)

# Distributions whose versions explain a figure; printed with every report.
VERSIONED_PACKAGES: tuple[str, ...] = ("icefloe", "pyarrow", "fastavro", "pyiceberg", "pydantic")

DEFAULT_REPEAT = 3
QUICK_REPEAT = 2


# ---------------------------------------------------------------------------------------
# Measurements and figures
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timing:
    """Wall-clock seconds of each timed run of one piece of work of ``work`` units."""

    seconds: tuple[float, ...]
    work: int = 1

    def __post_init__(self) -> None:
        if not self.seconds:
            raise ValidationError("a timing needs at least one measured run")
        if self.work <= 0:
            raise ValidationError(f"a timing's work must be positive, got {self.work}")

    @property
    def best(self) -> float:
        # perf_counter can return 0 for a run shorter than its resolution; a rate stays finite.
        return max(min(self.seconds), 1e-9)

    @property
    def median(self) -> float:
        return max(statistics.median(self.seconds), 1e-9)

    def to_json(self) -> dict[str, Any]:
        return {
            "work": self.work,
            "seconds": list(self.seconds),
            "best": self.best,
            "median": self.median,
        }


def _quiet_heap() -> None:
    """Collect, then freeze what survives, so a timed run's garbage collections only scan the
    objects the run itself creates (as in a fresh process), not every benchmark's inputs."""
    gc.collect()
    gc.freeze()


Warmup = bool | Callable[[], object]
AsyncWarmup = bool | Callable[[], Awaitable[object]]


def measure(
    run: Callable[[], object],
    *,
    work: int,
    repeat: int = DEFAULT_REPEAT,
    setup: Callable[[], object] | None = None,
    warmup: Warmup = True,
) -> Timing:
    """Time ``run`` ``repeat`` times, after an untimed warm-up.

    ``setup`` runs before every run, outside the clock, for work that must not be timed
    (rewinding a buffer, dropping the previous run's output). ``work`` is how many units one
    run processes, so figures can be given per unit (entries/s) whatever the run size.
    ``warmup`` is True to run ``run`` once untimed, a cheaper callable to run instead (a
    smaller input when one run takes many seconds), or False.
    """
    if repeat < 1:
        raise ValidationError(f"repeat must be at least 1, got {repeat}")
    if warmup is not False:
        if setup is not None:
            setup()
        (run if warmup is True else warmup)()
    samples: list[float] = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        _quiet_heap()
        try:
            start = time.perf_counter()
            run()
            samples.append(time.perf_counter() - start)
        finally:
            gc.unfreeze()
    return Timing(tuple(samples), work)


async def measure_async(
    run: Callable[[], Awaitable[object]],
    *,
    work: int,
    repeat: int = DEFAULT_REPEAT,
    setup: Callable[[], Awaitable[object]] | None = None,
    warmup: AsyncWarmup = True,
) -> Timing:
    """:func:`measure` for coroutines (commits, catalog round trips)."""
    if repeat < 1:
        raise ValidationError(f"repeat must be at least 1, got {repeat}")
    if warmup is not False:
        if setup is not None:
            await setup()
        await (run if warmup is True else warmup)()
    samples: list[float] = []
    for _ in range(repeat):
        if setup is not None:
            await setup()
        _quiet_heap()
        try:
            start = time.perf_counter()
            await run()
            samples.append(time.perf_counter() - start)
        finally:
            gc.unfreeze()
    return Timing(tuple(samples), work)


def measure_interleaved(
    runs: Mapping[str, Callable[[], object]],
    *,
    work: int,
    repeat: int = DEFAULT_REPEAT,
    setup: Mapping[str, Callable[[], object]] | None = None,
    warmup: Mapping[str, Warmup] | None = None,
) -> dict[str, Timing]:
    """Time implementations of the same work round by round: each runs once per round.

    On a shared machine load comes in bursts; timing all of one implementation's runs and
    then all of the next one's lets a burst land on one side of a ratio only. Interleaved, a
    burst costs every implementation one round, and the best-of figure skips that round. The
    order rotates from round to round so no implementation always runs first. ``setup`` and
    ``warmup`` are per implementation, as in :func:`measure`.
    """
    if repeat < 1:
        raise ValidationError(f"repeat must be at least 1, got {repeat}")
    if not runs:
        raise ValidationError("measure_interleaved needs at least one implementation")
    setups = dict(setup or {})
    warmups = dict(warmup or {})
    unknown = sorted((setups.keys() | warmups.keys()) - runs.keys())
    if unknown:
        raise ValidationError(f"setup or warm-up given for unknown implementations {unknown}")
    names = list(runs)
    for name in names:
        how = warmups.get(name, True)
        if how is not False:
            if name in setups:
                setups[name]()
            (runs[name] if how is True else how)()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeat):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            if name in setups:
                setups[name]()
            _quiet_heap()
            try:
                start = time.perf_counter()
                runs[name]()
                samples[name].append(time.perf_counter() - start)
            finally:
                gc.unfreeze()
    return {name: Timing(tuple(samples[name]), work) for name in names}


class Kind(Enum):
    """How a figure is stated: units per second (throughput) or milliseconds per unit."""

    RATE = "rate"
    LATENCY = "latency"


@dataclass(frozen=True, slots=True)
class Figure:
    """One number for icefloe and the same number for each peer, measured in the same run.

    A RATE figure is ``work / best seconds`` (e.g. entries/s); a LATENCY figure is best
    milliseconds per unit of work. Either way :meth:`speedup` is how many times faster icefloe
    was than the peer, so > 1 always means icefloe is ahead.
    """

    name: str
    unit: str
    icefloe: Timing
    peers: Mapping[str, Timing] = field(default_factory=dict)
    kind: Kind = Kind.RATE

    def value(self, timing: Timing, *, median: bool = False) -> float:
        seconds = timing.median if median else timing.best
        if self.kind is Kind.RATE:
            return timing.work / seconds
        return seconds * 1000.0 / timing.work

    def speedup(self, peer: str) -> float:
        """icefloe's advantage over ``peer``: its rate over the peer's (or the peer's time
        over icefloe's); > 1 means icefloe is faster."""
        timing = self.peers.get(peer)
        if timing is None:
            raise ValidationError(
                f"figure {self.name!r} has no peer {peer!r}; it has {sorted(self.peers)}"
            )
        ours, theirs = self.value(self.icefloe), self.value(timing)
        return ours / theirs if self.kind is Kind.RATE else theirs / ours

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "kind": self.kind.value,
            "icefloe": {"value": self.value(self.icefloe), **self.icefloe.to_json()},
            "peers": {
                name: {
                    "value": self.value(t),
                    "icefloe_speedup": self.speedup(name),
                    **t.to_json(),
                }
                for name, t in self.peers.items()
            },
        }


# ---------------------------------------------------------------------------------------
# Context, registry
# ---------------------------------------------------------------------------------------


@dataclass
class BenchContext:
    """What a benchmark is asked to do, and where it records what it did.

    ``sizes`` overrides the sizes a benchmark asks for with :meth:`size` (``--set``, or tiny
    sizes in tests); whatever size is used is recorded in ``params`` for the report.
    """

    quick: bool = False
    repeat: int = DEFAULT_REPEAT
    sizes: Mapping[str, int] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def size(self, name: str, *, full: int, quick: int) -> int:
        value = self.sizes.get(name, quick if self.quick else full)
        if value < 1:
            raise ValidationError(f"benchmark size {name}={value} must be at least 1")
        self.params[name] = value
        return value

    def note(self, text: str) -> None:
        """A line printed under the benchmark's figures (what was measured, caveats)."""
        self.notes.append(text)

    def measure(
        self,
        run: Callable[[], object],
        *,
        work: int,
        setup: Callable[[], object] | None = None,
        warmup: Warmup = True,
    ) -> Timing:
        return measure(run, work=work, repeat=self.repeat, setup=setup, warmup=warmup)

    def compare(
        self,
        runs: Mapping[str, Callable[[], object]],
        *,
        work: int,
        setup: Mapping[str, Callable[[], object]] | None = None,
        warmup: Mapping[str, Warmup] | None = None,
    ) -> dict[str, Timing]:
        """:func:`measure_interleaved` with this run's ``repeat``: icefloe and its peers."""
        return measure_interleaved(runs, work=work, repeat=self.repeat, setup=setup, warmup=warmup)

    async def measure_async(
        self,
        run: Callable[[], Awaitable[object]],
        *,
        work: int,
        setup: Callable[[], Awaitable[object]] | None = None,
        warmup: AsyncWarmup = True,
    ) -> Timing:
        return await measure_async(run, work=work, repeat=self.repeat, setup=setup, warmup=warmup)


BenchmarkFunction = Callable[[BenchContext], Iterable[Figure] | Awaitable[Iterable[Figure]]]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Benchmark:
    name: str
    description: str
    function: BenchmarkFunction


_REGISTRY: dict[str, Benchmark] = {}


def benchmark(name: str, description: str | None = None) -> Callable[[F], F]:
    """Register a benchmark under ``name`` (what ``--only`` selects).

    The description defaults to the first line of the function's docstring.
    """
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValidationError(
            f"benchmark name {name!r} must be non-empty letters, digits, '-' or '_'"
        )

    def register(function: F) -> F:
        existing = _REGISTRY.get(name)
        if existing is not None and existing.function is not function:
            where = getattr(existing.function, "__module__", "?")
            raise ValidationError(
                f"benchmark {name!r} is already registered by {where}; "
                f"{function.__module__} must pick another name"
            )
        doc = (function.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = Benchmark(name, description or (doc[0] if doc else name), function)
        return function

    return register


def load_benchmarks(modules: Sequence[str] = BENCHMARK_MODULES) -> dict[str, str]:
    """Import the benchmark modules; returns ``{module: reason}`` for those that failed."""
    failed: dict[str, str] = {}
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            failed[module] = f"{type(e).__name__}: {e}"
    return failed


def registered() -> dict[str, Benchmark]:
    return dict(_REGISTRY)


# ---------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------


@dataclass
class BenchmarkResult:
    name: str
    description: str
    params: dict[str, Any]
    figures: list[Figure]
    notes: list[str]
    wall_seconds: float
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "params": self.params,
            "figures": [f.to_json() for f in self.figures],
            "notes": self.notes,
            "wall_seconds": self.wall_seconds,
            "error": self.error,
        }


@dataclass
class Report:
    machine: dict[str, Any]
    results: list[BenchmarkResult]
    repeat: int
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(r.error is not None for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "repeat": self.repeat,
            "unavailable_modules": self.unavailable,
            "results": [r.to_json() for r in self.results],
        }


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """The facts a reader needs to judge the numbers: CPU, cores, Python and versions."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):  # not available on this platform
        load = None
    return {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 1,
        "usable_cores": usable,
        # Other processes competing for the cores when the run ended: the main source of noise.
        "load_average_1m": load,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": {name: _version(name) for name in VERSIONED_PACKAGES},
    }


def run_benchmark(bench: Benchmark, ctx: BenchContext) -> BenchmarkResult:
    """Run one benchmark; a failure is recorded in the result, never raised."""
    start = time.perf_counter()
    error: str | None = None
    figures: list[Figure] = []
    try:
        produced = bench.function(ctx)
        if inspect.isawaitable(produced):
            produced = asyncio.run(_await(produced))
        figures = list(produced)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        ctx.note("".join(traceback.format_exception(e)).rstrip())
    return BenchmarkResult(
        bench.name,
        bench.description,
        dict(ctx.params),
        figures,
        list(ctx.notes),
        time.perf_counter() - start,
        error,
    )


async def _await(awaitable: Awaitable[Iterable[Figure]]) -> Iterable[Figure]:
    return await awaitable


def select(names: Sequence[str] | None) -> list[Benchmark]:
    """The benchmarks to run, in registration order; unknown names are an error."""
    available = registered()
    if not names:
        return list(available.values())
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValidationError(
            f"unknown benchmark(s) {', '.join(unknown)}; available: "
            f"{', '.join(available) or 'none'}"
        )
    return [available[n] for n in dict.fromkeys(names)]


def run_benchmarks(
    names: Sequence[str] | None = None,
    *,
    quick: bool = False,
    repeat: int | None = None,
    sizes: Mapping[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    unavailable = load_benchmarks()
    chosen = select(names)
    runs = repeat if repeat is not None else (QUICK_REPEAT if quick else DEFAULT_REPEAT)
    if runs < 1:
        raise ValidationError(f"--repeat must be at least 1, got {runs}")
    results = []
    for bench in chosen:
        if progress is not None:
            progress(f"running {bench.name}: {bench.description}")
        ctx = BenchContext(quick=quick, repeat=runs, sizes=dict(sizes or {}))
        results.append(run_benchmark(bench, ctx))
    return Report(machine_info(), results, runs, unavailable)


# ---------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------


def format_number(value: float) -> str:
    """Thousands separators for big numbers, three significant digits for small ones."""
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


_HEADER = ("benchmark", "figure", "unit", "icefloe", "peer", "peer value", "icefloe speed-up")
_RIGHT = {3, 5, 6}


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in _RIGHT else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def format_report(report: Report) -> str:
    m = report.machine
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    load = m.get("load_average_1m")
    load_text = f", load {load:.1f}" if load is not None else ""
    out = [
        f"machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable{load_text}), "
        f"{m['python']}, {m['platform']}",
        f"versions: {versions}",
        f"timing: best of {report.repeat} runs after a warm-up (every run in --json); "
        "speed-up > 1 means icefloe is faster",
        "",
    ]
    rows: list[tuple[str, ...]] = [_HEADER]
    for result in report.results:
        bench_cell = result.name
        if result.error is not None:
            rows.append((bench_cell, "FAILED", "", "", "", "", ""))
            continue
        for figure in result.figures:
            icefloe_cell = format_number(figure.value(figure.icefloe))
            if not figure.peers:
                rows.append((bench_cell, figure.name, figure.unit, icefloe_cell, "", "", ""))
                bench_cell = ""
                continue
            first = True
            for peer, timing in figure.peers.items():
                rows.append(
                    (
                        bench_cell if first else "",
                        figure.name if first else "",
                        figure.unit if first else "",
                        icefloe_cell if first else "",
                        peer,
                        format_number(figure.value(timing)),
                        f"{figure.speedup(peer):.2f}x",
                    )
                )
                first = False
                bench_cell = ""
    out.extend(_table(rows))
    for result in report.results:
        params = ", ".join(f"{k}={v}" for k, v in result.params.items())
        head = f"{result.name} ({result.wall_seconds:.1f}s{', ' + params if params else ''})"
        if result.error is not None:
            out += ["", f"{head}: FAILED: {result.error}"]
        elif result.notes:
            out += ["", f"{head}:"]
        for note in result.notes:
            out.extend(f"  {line}" for line in note.splitlines())
    for module, reason in report.unavailable.items():
        out += ["", f"not run: {module} could not be imported ({reason})"]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def _size_override(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=INTEGER (e.g. entries=1000), got {text!r}")
    return name.strip(), int(value)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m icefloe.dev.bench",
        description="Run icefloe's benchmarks; each figure is printed beside its peers.",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this benchmark (repeatable, or comma-separated)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and fewer runs")
    parser.add_argument("--repeat", type=int, metavar="N", help="timed runs per measurement")
    parser.add_argument(
        "--set",
        action="append",
        type=_size_override,
        default=[],
        metavar="NAME=VALUE",
        dest="sizes",
        help="override a benchmark size, e.g. --set entries=20000",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run under cProfile and print where icefloe's own code spends its time",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    return parser


def _profile_summary(profiler: cProfile.Profile) -> str:
    buffer = io.StringIO()
    stats = pstats.Stats(profiler, stream=buffer)
    # icefloe's own modules, not the benchmark code that drives them.
    stats.sort_stats(pstats.SortKey.TIME).print_stats(r"icefloe/(?!bench)", 30)
    return buffer.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    names = [n.strip() for item in args.only or () for n in item.split(",") if n.strip()]
    if args.list:
        unavailable = load_benchmarks()
        for bench in registered().values():
            print(f"{bench.name:<16} {bench.description}")
        for module, reason in unavailable.items():
            print(f"(not available: {module}: {reason})")
        return 0
    profiler = cProfile.Profile() if args.profile else None
    try:
        if profiler is not None:
            profiler.enable()
        try:
            report = run_benchmarks(
                names or None,
                quick=args.quick,
                repeat=args.repeat,
                sizes=dict(args.sizes),
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )
        finally:
            if profiler is not None:
                profiler.disable()
    except ValidationError as e:
        parser.error(str(e))
    print(format_report(report))
    if profiler is not None:
        print("\nprofile (icefloe functions by own time):\n" + _profile_summary(profiler))
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report.to_json(), f, indent=2)
                f.write("\n")
        except OSError as e:
            print(f"bench: cannot write {args.json}: {e}", file=sys.stderr)
            return 1
    return 1 if report.failed else 0


if __name__ == "__main__":
    # Run the importable module rather than this ``__main__`` copy: benchmark modules import
    # ``icefloe.dev.bench`` to register, and both must see one registry.
    from icefloe.dev.bench import main as _main

    sys.exit(_main())
