"""``make bench``: the registry, the measurement helpers, the report, and the manifest
benchmark run on tiny sizes. Nothing here asserts how fast anything is: only that every
figure is there, measured the stated number of times, and reported consistently."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from icefloe.dev.bench import (
    BenchContext,
    Benchmark,
    Figure,
    Kind,
    Report,
    Timing,
    benchmark,
    format_number,
    format_report,
    load_benchmarks,
    machine_info,
    main,
    measure,
    measure_interleaved,
    registered,
    run_benchmark,
    run_benchmarks,
)
from icefloe.dev.bench_manifest import (
    SCHEMA,
    SPEC,
    BenchmarkCheckError,
    check_icefloe_entries,
    icefloe_read,
    icefloe_write,
    make_data_files,
    manifest_benchmark,
)
from icefloe.errors import ValidationError

TINY = {"entries": 24}


# -- the manifest benchmark ---------------------------------------------------------------


def test_manifest_benchmark_reports_write_and_read_against_both_peers() -> None:
    ctx = BenchContext(repeat=2, sizes=TINY)
    figures = list(manifest_benchmark(ctx))
    assert [(f.name, f.unit, f.kind) for f in figures] == [
        ("write", "entries/s", Kind.RATE),
        ("read", "entries/s", Kind.RATE),
    ]
    assert list(figures[0].peers) == ["fastavro", "pyiceberg"]
    assert list(figures[1].peers) == ["fastavro", "pyiceberg", "pyiceberg+maps"]
    for figure in figures:
        for timing in (figure.icefloe, *figure.peers.values()):
            assert timing.work == TINY["entries"]
            assert len(timing.seconds) == 2
        for peer in figure.peers:
            assert math.isfinite(figure.speedup(peer)) and figure.speedup(peer) > 0
    assert ctx.params == {"entries": 24, "format_version": 2, "codec": "deflate"}
    assert any("B/entry" in note and "pyiceberg" in note for note in ctx.notes)


def test_the_benchmark_records_are_valid_and_read_back_exactly() -> None:
    files = make_data_files(50)
    assert make_data_files(50) == files  # deterministic for a seed
    assert len({f.file_path for f in files}) == 50
    for f in files:
        assert f.lower_bounds is not None and f.upper_bounds is not None
        assert set(f.lower_bounds) == {field.field_id for field in SCHEMA.fields}
        assert 0 <= f.partition[1] < 16
        f.validate()
    data, manifest = icefloe_write(files)
    assert manifest.partition_spec_id == SPEC.spec_id
    check_icefloe_entries("round trip", icefloe_read(data, manifest), files)


def test_the_benchmark_check_rejects_wrong_output() -> None:
    files = make_data_files(5)
    data, manifest = icefloe_write(files)
    entries = icefloe_read(data, manifest)
    with pytest.raises(BenchmarkCheckError, match="entry 3"):
        check_icefloe_entries("tampered", entries, [*files[:3], files[4], files[3]])
    with pytest.raises(BenchmarkCheckError, match="read 5 entries, wrote 4"):
        check_icefloe_entries("short", entries, files[:4])


# -- figures and measurements -------------------------------------------------------------


def test_rate_and_latency_figures_state_speed_up_the_same_way() -> None:
    ours, theirs = Timing((2.0, 1.0, 4.0), work=10), Timing((4.0,), work=10)
    assert (ours.best, ours.median) == (1.0, 2.0)
    rate = Figure("write", "entries/s", ours, {"peer": theirs})
    assert (rate.value(ours), rate.value(theirs)) == (10.0, 2.5)
    assert rate.value(ours, median=True) == 5.0
    assert rate.speedup("peer") == 4.0
    latency = Figure("commit", "ms", ours, {"peer": theirs}, kind=Kind.LATENCY)
    assert (latency.value(ours), latency.value(theirs)) == (100.0, 400.0)
    assert latency.speedup("peer") == 4.0
    with pytest.raises(ValidationError, match="no peer 'other'"):
        rate.speedup("other")
    encoded = rate.to_json()
    assert encoded["peers"]["peer"]["icefloe_speedup"] == 4.0
    assert encoded["icefloe"]["seconds"] == [2.0, 1.0, 4.0]


def test_timings_need_runs_and_work() -> None:
    with pytest.raises(ValidationError, match="at least one"):
        Timing(())
    with pytest.raises(ValidationError, match="positive"):
        Timing((1.0,), work=0)


def test_measure_warms_up_then_runs_setup_before_every_timed_run() -> None:
    calls: list[str] = []
    timing = measure(lambda: calls.append("run"), work=7, repeat=3, setup=lambda: calls.append("s"))
    assert calls == ["s", "run"] + ["s", "run"] * 3
    assert (len(timing.seconds), timing.work) == (3, 7)

    calls.clear()
    measure(lambda: calls.append("run"), work=1, repeat=2, warmup=lambda: calls.append("warm"))
    assert calls == ["warm", "run", "run"]
    calls.clear()
    measure(lambda: calls.append("run"), work=1, repeat=2, warmup=False)
    assert calls == ["run", "run"]
    with pytest.raises(ValidationError, match="repeat"):
        measure(lambda: None, work=1, repeat=0)


def test_interleaved_rounds_rotate_the_order_and_keep_setups_apart() -> None:
    calls: list[str] = []

    def step(name: str) -> None:
        calls.append(name)

    timings = measure_interleaved(
        {name: (lambda n=name: step(n)) for name in ("a", "b", "c")},
        work=5,
        repeat=3,
        setup={"b": lambda: step("setup-b")},
        warmup={"a": lambda: step("warm-a"), "c": False},
    )
    assert calls == [
        *("warm-a", "setup-b", "b"),  # warm-ups: a's own, b runs once, c none
        *("a", "setup-b", "b", "c"),
        *("setup-b", "b", "c", "a"),
        *("c", "a", "setup-b", "b"),
    ]
    assert {name: (len(t.seconds), t.work) for name, t in timings.items()} == {
        "a": (3, 5),
        "b": (3, 5),
        "c": (3, 5),
    }
    with pytest.raises(ValidationError, match=r"unknown implementations \['z'\]"):
        measure_interleaved({"a": lambda: None}, work=1, setup={"z": lambda: None})
    with pytest.raises(ValidationError, match="at least one implementation"):
        measure_interleaved({}, work=1)
    with pytest.raises(ValidationError, match="repeat"):
        BenchContext(repeat=0).compare({"a": lambda: None}, work=1)


def test_context_sizes_follow_quick_mode_and_overrides() -> None:
    assert BenchContext().size("n", full=100, quick=10) == 100
    assert BenchContext(quick=True).size("n", full=100, quick=10) == 10
    ctx = BenchContext(quick=True, sizes={"n": 3})
    assert ctx.size("n", full=100, quick=10) == 3
    assert ctx.params == {"n": 3}
    with pytest.raises(ValidationError, match="at least 1"):
        BenchContext(sizes={"n": 0}).size("n", full=1, quick=1)


def test_format_number() -> None:
    assert format_number(123456.7) == "123,457"
    assert format_number(12.345) == "12.3"
    assert format_number(0.0012345) == "0.00123"
    assert format_number(math.inf) == "inf"


# -- registry and runner ------------------------------------------------------------------


def test_the_registry_knows_the_manifest_benchmark_and_refuses_a_second_owner() -> None:
    assert "icefloe.dev.bench_manifest" not in load_benchmarks()
    assert registered()["manifest"].function is manifest_benchmark
    assert registered()["manifest"].description.startswith("Manifest entries")
    assert load_benchmarks(["icefloe.no_such_bench_module"]) == {
        "icefloe.no_such_bench_module": "ModuleNotFoundError: No module named "
        "'icefloe.no_such_bench_module'"
    }

    def impostor(ctx: BenchContext) -> list[Figure]:
        return []

    with pytest.raises(
        ValidationError, match=r"already registered by icefloe\.dev\.bench_manifest"
    ):
        benchmark("manifest")(impostor)
    with pytest.raises(ValidationError, match="must be non-empty"):
        benchmark("has space")
    assert registered()["manifest"].function is manifest_benchmark


def _one_figure(ctx: BenchContext) -> list[Figure]:
    timing = ctx.measure(lambda: sum(range(100)), work=100)
    return [Figure("sum", "items/s", timing, {"itself": timing})]


def test_failures_are_reported_not_raised_and_coroutines_are_awaited() -> None:
    def broken(ctx: BenchContext) -> list[Figure]:
        ctx.note("started")
        raise ValidationError("the peer refused")

    async def asynchronous(ctx: BenchContext) -> list[Figure]:
        return _one_figure(ctx)

    failed = run_benchmark(Benchmark("broken", "always fails", broken), BenchContext(repeat=1))
    assert failed.error == "ValidationError: the peer refused"
    assert failed.figures == []
    assert failed.notes[0] == "started" and "Traceback" in failed.notes[1]

    ok = run_benchmark(Benchmark("async", "a coroutine", asynchronous), BenchContext(repeat=2))
    assert ok.error is None
    assert [f.name for f in ok.figures] == ["sum"]
    assert ok.figures[0].speedup("itself") == 1.0
    assert len(ok.figures[0].icefloe.seconds) == 2


def test_report_table_and_json_carry_every_figure() -> None:
    report = run_benchmarks(["manifest"], repeat=1, sizes=TINY)
    assert not report.failed
    assert report.repeat == 1
    assert report.machine["cores"] >= 1 and report.machine["usable_cores"] >= 1
    assert report.machine["versions"]["pyiceberg"] != "not installed"
    text = format_report(report)
    lines = text.splitlines()
    assert lines[0].startswith("machine: ") and "cores" in lines[0]
    assert lines[1].startswith("versions: ") and "fastavro" in lines[1]
    header = next(i for i, line in enumerate(lines) if line.startswith("benchmark"))
    figures = report.results[0].figures
    expected = [(p, f"{f.speedup(p):.2f}x") for f in figures for p in f.peers]
    table = lines[header : header + 1 + len(expected)]
    assert [tuple(line.split()[-3::2]) for line in table[1:]] == expected
    # Aligned: every speed-up ends in the same column.
    assert len({len(line) for line in table[1:]}) == 1
    assert "entries=24" in text
    encoded = json.loads(json.dumps(report.to_json()))
    (result,) = encoded["results"]
    assert result["name"] == "manifest" and result["error"] is None
    assert [f["name"] for f in result["figures"]] == ["write", "read"]
    assert set(result["figures"][1]["peers"]) == {"fastavro", "pyiceberg", "pyiceberg+maps"}


def test_a_failed_benchmark_shows_in_the_report() -> None:
    def broken(ctx: BenchContext) -> list[Figure]:
        raise ValidationError("no peer today")

    result = run_benchmark(Benchmark("broken", "always fails", broken), BenchContext(repeat=1))
    ok = run_benchmark(Benchmark("ok", "works", _one_figure), BenchContext(repeat=1))
    report = Report(machine_info(), [result, ok], repeat=1, unavailable={"x.y": "gone"})
    assert report.failed
    text = format_report(report)
    assert "broken (" in text and "FAILED: ValidationError: no peer today" in text
    assert "not run: x.y could not be imported (gone)" in text
    assert any(line.startswith("ok") and "itself" in line for line in text.splitlines())


# -- command line -------------------------------------------------------------------------


def test_main_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    code = main(["--only", "manifest", "--repeat", "1", "--set", "entries=20", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "icefloe speed-up" in printed and "pyiceberg" in printed
    saved = json.loads(out.read_text())
    assert saved["repeat"] == 1
    assert saved["results"][0]["params"]["entries"] == 20


def test_main_rejects_unknown_names_and_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--only", "nope"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown benchmark(s) nope; available: " in err
    assert "manifest" in err.split("available: ", 1)[1].replace(",", " ").split()
    with pytest.raises(SystemExit):
        main(["--set", "entries"])
    assert "expected NAME=INTEGER" in capsys.readouterr().err


def test_main_lists_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    # one line per registered benchmark, its name first (registration order follows imports)
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert "manifest" in names and "upsert" in names and len(names) == len(set(names))


def test_python_dash_m_runs_the_registered_benchmarks(tmp_path: Path) -> None:
    """``make bench`` runs the module as ``__main__``; registrations must still be seen."""
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "icefloe.dev.bench",
            "--only",
            "manifest",
            "--quick",
            "--repeat",
            "1",
            "--set",
            "entries=16",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "manifest" in done.stdout and "fastavro" in done.stdout
    assert json.loads(out.read_text())["results"][0]["params"]["entries"] == 16
