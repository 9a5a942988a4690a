"""Settings flags: every setting has a flag except secrets, which come from the environment
or from a secrets directory (a mounted Kubernetes secret volume)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from icefloe.coordinator.config import CoordinatorConfig
from icefloe.coordinator.config import add_arguments as add_coordinator_arguments
from icefloe.errors import ValidationError
from icefloe.planner.config import PlannerConfig
from icefloe.planner.config import add_arguments as add_planner_arguments
from icefloe.runtime.settings import SECRETS_DIR_ENV, is_secret


@pytest.mark.parametrize(
    ("add", "settings", "secrets"),
    [
        (add_coordinator_arguments, CoordinatorConfig, {"sasl_password", "tls_key_password"}),
        (add_planner_arguments, PlannerConfig, {"sasl_password", "tls_key_password", "token"}),
    ],
)
def test_secrets_have_no_command_line_flag(add, settings, secrets) -> None:  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add(parser)
    flags = {a.dest for a in parser._actions}
    found = {name for name, info in settings.model_fields.items() if is_secret(info)}
    assert secrets <= found
    assert not (found & flags), f"secret settings exposed as flags: {found & flags}"
    for name in secrets:
        with pytest.raises(SystemExit):
            parser.parse_args(["--" + name.replace("_", "-"), "x"])
    # every other setting keeps its flag, unless it is marked environment-only
    env_only = {
        name
        for name, info in settings.model_fields.items()
        if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("flag") is False
    }
    assert not (env_only & flags)
    assert set(settings.model_fields) - found - env_only <= flags


def test_secrets_come_from_a_secrets_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ICEFLOE_PLANNER_TOKEN").write_text("from-a-file")
    (tmp_path / "ICEFLOE_SASL_PASSWORD").write_text("kafka-secret")
    monkeypatch.setenv(SECRETS_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("ICEFLOE_PLANNER_CATALOG", "file:///tmp/wh")
    planner = PlannerConfig.load()
    assert planner.token is not None and planner.token.get_secret_value() == "from-a-file"
    coordinator = CoordinatorConfig.load(
        {
            "catalog": "file:///tmp/wh",
            "brokers": "b:1",
            "sasl_mechanism": "PLAIN",
            "sasl_username": "u",
        }
    )
    assert coordinator.sasl_password is not None
    assert coordinator.sasl_password.get_secret_value() == "kafka-secret"
    # the environment wins over a file, as pydantic-settings orders its sources
    monkeypatch.setenv("ICEFLOE_PLANNER_TOKEN", "from-env")
    token = PlannerConfig.load().token
    assert token is not None and token.get_secret_value() == "from-env"


def test_a_missing_secrets_directory_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRETS_DIR_ENV, "/nonexistent/secrets")
    monkeypatch.setenv("ICEFLOE_PLANNER_CATALOG", "file:///tmp/wh")
    with pytest.raises(ValidationError, match="ICEFLOE_SECRETS_DIR='/nonexistent/secrets'"):
        PlannerConfig.load()


def test_bad_settings_are_named_by_their_variable_and_say_what_is_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ICEFLOE_CATALOG", raising=False)
    with pytest.raises(ValidationError) as info:
        CoordinatorConfig.load({"batch_max_files": 0, "brokers": "b:1"})
    message = str(info.value)
    assert "setting ICEFLOE_BATCH_MAX_FILES: input should be greater than or equal to 1" in message
    assert "missing required setting ICEFLOE_CATALOG" in message
    assert "(got" not in message  # values are left out: a setting may be a secret
