"""The command line a newcomer reads: help on every subcommand and flag, with its default, and
the exit statuses the README states (0, 1 with one ``icefloe: error:`` line, 2 for usage)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest

from icefloe.cli.main import build_parser, main
from icefloe.coordinator.config import add_arguments as add_coordinator_arguments
from icefloe.runtime.command import EXIT_ERROR, EXIT_OK, EXIT_USAGE, ArgumentParser


def _coordinator_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m icefloe.coordinator``, as its ``main`` builds it."""
    parser = ArgumentParser(prog="icefloe coordinator")
    add_coordinator_arguments(parser)
    return parser


def parsers(
    parser: argparse.ArgumentParser, name: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``parser`` and every subcommand's parser below it, by command line."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from parsers(sub, f"{name} {sub_name}")


def _all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    return [
        *parsers(build_parser(), "icefloe"),
        ("python -m icefloe.coordinator", _coordinator_parser()),
    ]


def test_every_subcommand_has_help() -> None:
    missing = []
    for name, parser in _all_parsers():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {a.dest for a in action._choices_actions if a.help}
                missing += [f"{name} {sub}" for sub in action.choices if sub not in helped]
    assert not missing, f"subcommands without help: {missing}"


def test_every_flag_and_argument_has_help_and_shows_its_default() -> None:
    no_help, no_default = [], []
    for name, parser in _all_parsers():
        assert isinstance(parser.formatter_class, type) and issubclass(
            parser.formatter_class, argparse.HelpFormatter
        )
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            what = f"{name} {'/'.join(action.option_strings) or action.dest}"
            if not action.help or action.help == argparse.SUPPRESS:
                no_help.append(what)
                continue
            default = action.default
            if default in (None, False, argparse.SUPPRESS) or default == [] or action.nargs == 0:
                continue
            if str(default) not in formatter._expand_help(action):
                no_default.append(f"{what} (default {default!r})")
    assert not no_help, f"without help: {no_help}"
    assert not no_default, f"help does not show the default: {no_default}"


def test_help_exits_0_for_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    for name, _ in parsers(build_parser(), "icefloe"):
        argv = name.split()[1:]
        with pytest.raises(SystemExit) as exited:
            main([*argv, "--help"])
        assert exited.value.code == EXIT_OK, name
        assert capsys.readouterr().out.startswith("usage: " + name)


def test_usage_errors_exit_2_with_the_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["no-such-command"], ["table", "create"], ["scan", "db.t", "--snapshot", "x"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == EXIT_USAGE, argv
        err = capsys.readouterr().err
        assert err.startswith("usage: icefloe") and "icefloe" in err.splitlines()[-1]
        assert ": error: " in err.splitlines()[-1]


def test_errors_exit_1_with_one_error_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ICEFLOE_CATALOG", raising=False)
    code = main(["table", "describe", "db.t", "--catalog", "nosuch://x"])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert err.startswith("icefloe: error: ") and err.count("\n") == 1, err


def test_the_coordinator_module_exits_1_on_bad_settings_and_2_on_bad_flags() -> None:
    env = {"PATH": "/usr/bin:/bin", "ICEFLOE_LOG_FORMAT": "text"}
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "icefloe.coordinator",
            "--catalog",
            "file:///w",
            "--log-level",
            "loud",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == EXIT_ERROR, bad.stderr
    assert bad.stderr.startswith("icefloe: error: ") and "ICEFLOE_LOG_LEVEL" in bad.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "icefloe.coordinator", "--batch-max-files", "many"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert usage.returncode == EXIT_USAGE
    assert "icefloe coordinator: error: argument --batch-max-files" in usage.stderr


def test_table_compact_takes_its_brokers_from_a_flag_defaulting_to_the_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ICEFLOE_BROKERS", "kafka-a:9092")
    assert build_parser().parse_args(["table", "compact", "ns.t"]).brokers == "kafka-a:9092"
    given = build_parser().parse_args(["table", "compact", "ns.t", "--brokers", "b:1"])
    assert given.brokers == "b:1"
    with pytest.raises(SystemExit):
        main(["table", "compact", "--help"])
    out = capsys.readouterr().out
    assert "--brokers" in out and "ICEFLOE_BROKERS" in out and "kafka-a:9092" in out
