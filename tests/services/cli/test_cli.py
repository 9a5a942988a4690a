"""The ``icefloe`` console command: metadata, manifests, namespaces and tables."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from icefloe.catalog.uri import load_catalog
from icefloe.cli.main import main
from icefloe.spec.datafile import DataFile
from icefloe.table.snapshot_producer import fast_append

# Apache Iceberg's conformance files, copied into the repository (tests/fixtures)
CONFORMANCE = Path(__file__).resolve().parents[2] / "fixtures" / "conformance" / "table-metadata"

SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"id": 1, "name": "id", "required": True, "type": "long"},
            {"id": 2, "name": "ts", "required": False, "type": "timestamptz"},
            {"id": 3, "name": "name", "required": False, "type": "string"},
        ],
    }
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "name", ["V1Valid.json", "V2Valid.json", "V2ValidMinimal.json", "V3ValidMinimal.json"]
)
def test_metadata_check_prints_valid_metadata_normalized(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    code, out, err = run(capsys, "metadata", "check", str(CONFORMANCE / name))
    assert code == 0, err
    original = json.loads((CONFORMANCE / name).read_text())
    printed = json.loads(out)
    assert printed["format-version"] == original["format-version"]
    assert printed["table-uuid"] == original["table-uuid"]


@pytest.mark.parametrize(
    ("name", "named"),
    [("UnsupportedVersion.json", "42"), ("V2MissingSchemas.json", "schemas")],
)
def test_metadata_check_refuses_invalid_metadata_naming_the_problem(
    capsys: pytest.CaptureFixture[str], name: str, named: str
) -> None:
    code, out, err = run(capsys, "metadata", "check", str(CONFORMANCE / name))
    assert code == 1 and out == ""
    assert err.startswith("icefloe: error:") and named in err


def test_metadata_check_names_a_missing_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nope.metadata.json"
    code, _, err = run(capsys, "metadata", "check", str(missing))
    assert code == 1 and str(missing) in err


def test_namespace_and_table_commands_against_a_catalog_uri(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"file://{tmp_path}/wh"
    monkeypatch.setenv("ICEFLOE_CATALOG", uri)
    assert run(capsys, "namespace", "create", "db", "-p", "owner=ops")[0] == 0
    code, out, _ = run(capsys, "namespace", "list")
    assert code == 0 and out.split() == ["db"]
    code, out, _ = run(capsys, "namespace", "show", "db")
    assert json.loads(out) == {"owner": "ops"}

    code, out, err = run(
        capsys,
        "table",
        "create",
        "db.events",
        "--schema",
        SCHEMA,
        "--partition-by",
        "day(ts)",
        "--partition-by",
        "bucket(16, id)",
        "--catalog",
        uri,
    )
    assert code == 0, err
    metadata_location = out.strip()
    assert metadata_location.endswith("v1.metadata.json")
    code, out, _ = run(capsys, "table", "list", "db")
    assert out.split() == ["db.events"]

    async def append_two() -> None:
        catalog = load_catalog(uri)
        table = await catalog.load_table("db.events")
        for n in range(2):
            f = DataFile(f"{table.location}/data/f{n}.parquet", "parquet", (19000 + n, n), 10, 100)
            table = await fast_append(table, [f]).commit()
        await catalog.close()

    asyncio.run(append_two())
    code, out, _ = run(capsys, "table", "describe", "db.events")
    described = json.loads(out)
    assert code == 0 and described["snapshots"] == 2
    assert [f["transform"] for f in described["partition-spec"]["fields"]] == ["day", "bucket[16]"]
    code, out, _ = run(capsys, "table", "snapshots", "db.events")
    snapshots = [json.loads(line) for line in out.splitlines()]
    assert [s["summary"]["total-data-files"] for s in snapshots] == ["1", "2"]

    # manifest show decodes both the manifest list and a manifest
    code, out, err = run(capsys, "manifest", "show", snapshots[-1]["manifest-list"])
    assert code == 0, err
    manifests = [json.loads(line) for line in out.splitlines()]
    assert len(manifests) == 2 and all(m["kind"] == "manifest-file" for m in manifests)
    code, out, err = run(capsys, "manifest", "show", manifests[0]["manifest_path"])
    assert code == 0, err
    entries = [json.loads(line) for line in out.splitlines()]
    assert entries[0]["kind"] == "manifest-entry" and entries[0]["status"] == "added"
    assert entries[0]["data-file"]["partition"][0] in ("2022-01-08", "2022-01-09")

    code, out, _ = run(capsys, "table", "expire", "db.events", "--older-than-ms", str(2**62))
    assert code == 0 and len(json.loads(out)["expired-snapshot-ids"]) == 1

    # bad input: a malformed property, an unknown table, a non-empty namespace
    code, _, err = run(capsys, "namespace", "create", "other", "-p", "novalue")
    assert code == 1 and "key=value" in err
    code, _, err = run(capsys, "table", "describe", "db.missing")
    assert code == 1 and "db.missing" in err
    code, _, err = run(capsys, "namespace", "drop", "db")
    assert code == 1 and "not empty" in err
    assert run(capsys, "table", "drop", "db.events", "--purge")[0] == 0
    assert run(capsys, "namespace", "drop", "db")[0] == 0


def test_manifest_show_refuses_a_foreign_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    junk = tmp_path / "junk.avro"
    junk.write_bytes(b"definitely not avro")
    code, _, err = run(capsys, "manifest", "show", str(junk))
    assert code == 1 and str(junk) in err


def test_commands_without_a_catalog_say_how_to_name_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ICEFLOE_CATALOG", raising=False)
    code, _, err = run(capsys, "namespace", "list")
    assert code == 1 and "ICEFLOE_CATALOG" in err


def test_version_flag_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"icefloe {version('icefloe')}"


def test_tables_are_created_keyed_and_their_identifier_fields_set_later(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ICEFLOE_CATALOG", f"file://{tmp_path}/wh")
    assert run(capsys, "namespace", "create", "db")[0] == 0
    code, _, err = run(
        capsys, "table", "create", "db.keyed", "--schema", SCHEMA, "--identifier-field", "id"
    )
    assert code == 0, err

    def identifiers(table: str) -> list[str]:
        described = json.loads(run(capsys, "table", "describe", table)[1])
        schema = described["schema"]
        by_id = {f["id"]: f["name"] for f in schema["fields"]}
        return [by_id[i] for i in schema.get("identifier-field-ids", [])]

    assert identifiers("db.keyed") == ["id"]
    code, _, err = run(
        capsys, "table", "create", "db.bad", "--schema", SCHEMA, "--identifier-field", "name"
    )
    assert code == 1 and "'name'" in err and "optional" in err
    code, _, err = run(
        capsys, "table", "create", "db.bad", "--schema", SCHEMA, "--identifier-field", "nope"
    )
    assert code == 1 and "'nope'" in err

    assert run(capsys, "table", "create", "db.plain", "--schema", SCHEMA)[0] == 0
    assert identifiers("db.plain") == []
    code, out, err = run(capsys, "table", "set-identifier-fields", "db.plain", "id")
    assert code == 0 and out.strip().endswith(".metadata.json"), err
    assert identifiers("db.plain") == ["id"]
    code, _, err = run(capsys, "table", "set-identifier-fields", "db.plain", "ts")
    assert code == 1 and "'ts'" in err and "optional" in err
    assert identifiers("db.plain") == ["id"]
    assert run(capsys, "table", "set-identifier-fields", "db.plain")[0] == 0
    assert identifiers("db.plain") == []


def test_table_properties_are_listed_set_and_unset_in_one_commit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from icefloe.table.commit_index import DEDUP_WINDOW_MS
    from icefloe.table.dedup_ledger import LEDGER_PROPERTY

    monkeypatch.setenv("ICEFLOE_CATALOG", f"file://{tmp_path}/wh")
    assert run(capsys, "namespace", "create", "db")[0] == 0
    code, _, err = run(capsys, "table", "create", "db.t", "--schema", SCHEMA, "-p", "a=1")
    assert code == 0, err

    def metadata_files() -> int:
        return len(list(tmp_path.glob("wh/db/t/metadata/*.metadata.json")))

    code, out, err = run(capsys, "table", "properties", "db.t")
    assert code == 0, err
    assert json.loads(out)["a"] == "1"
    before = metadata_files()
    code, out, err = run(
        capsys,
        "table",
        "properties",
        "db.t",
        "--set",
        "icefloe.maintenance.max-snapshots=20",
        "--set",
        f"{DEDUP_WINDOW_MS}=3600000",
        "--unset",
        "a",
    )
    assert code == 0, err
    props = json.loads(out)
    assert props["icefloe.maintenance.max-snapshots"] == "20"
    assert props[DEDUP_WINDOW_MS] == "3600000" and "a" not in props
    assert metadata_files() == before + 1  # one commit for all three changes
    code, out, _ = run(capsys, "table", "describe", "db.t")
    assert json.loads(out)["properties"] == props

    # the REST catalog's rules, from the same code: the dedup ledger is not a user's to edit
    for argv in (["--set", f"{LEDGER_PROPERTY}=[]"], ["--unset", LEDGER_PROPERTY]):
        code, out, err = run(capsys, "table", "properties", "db.t", *argv)
        assert code == 1 and out == "" and LEDGER_PROPERTY in err
    code, _, err = run(
        capsys, "table", "properties", "db.t", "--set", "icefloe.maintenance.enabled=maybe"
    )
    assert code == 1 and "icefloe.maintenance.enabled" in err and "true or false" in err
    code, _, err = run(capsys, "table", "properties", "db.t", "--set", "b=1", "--unset", "b")
    assert code == 1 and "both set and unset" in err
    code, _, err = run(capsys, "table", "properties", "db.t", "--set", "novalue")
    assert code == 1 and "key=value" in err
    code, _, err = run(capsys, "table", "properties", "db.missing", "--set", "b=1")
    assert code == 1 and "db.missing" in err
    assert metadata_files() == before + 1  # nothing refused was written


def test_health_shows_what_holds_expiry_back_and_orphan_removal_only_when_due(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from icefloe.table.maintenance_policy import ORPHANS_LAST_RUN_MS

    uri = f"file://{tmp_path}/wh"
    monkeypatch.setenv("ICEFLOE_CATALOG", uri)
    assert run(capsys, "namespace", "create", "db")[0] == 0
    assert run(capsys, "table", "create", "db.t", "--schema", SCHEMA)[0] == 0

    async def append() -> None:
        catalog = load_catalog(uri)
        table = await catalog.load_table("db.t")
        f = DataFile(f"{table.location}/data/f.parquet", "parquet", (), 10, 100)
        await fast_append(table, [f]).commit()
        await catalog.close()

    asyncio.run(append())

    def health(*flags: str) -> Any:
        code, out, err = run(capsys, "table", "health", "db.t", *flags)
        assert code == 0, err
        return json.loads(out)

    def next_actions(report: Any) -> set[str]:
        return {a["action"] for a in report["next"]}

    before = health()
    expiry = before["expiry"]
    assert isinstance(expiry, dict)
    assert expiry["snapshots"] == 1 and expiry["kept-by-policy"] == 1
    assert expiry["limits"]["min-retain-ms"] == 86_400_000  # the coordinator's default floor
    monkeypatch.setenv("ICEFLOE_MAINTENANCE_MIN_RETAIN_MS", "5000")
    assert health()["expiry"]["limits"]["min-retain-ms"] == 5000
    assert "remove-orphan-files" in next_actions(before)

    code, out, err = run(capsys, "table", "maintain", "db.t")
    assert code == 0, err
    assert json.loads(out)["errors"] == []
    code, out, _ = run(capsys, "table", "properties", "db.t")
    assert ORPHANS_LAST_RUN_MS in json.loads(out)  # recorded in the table: survives restarts
    assert "remove-orphan-files" not in next_actions(health())  # not due again for a day
    # a shorter interval makes it due again, as the runner would see it
    code, _, err = run(
        capsys,
        "table",
        "properties",
        "db.t",
        "--set",
        "icefloe.maintenance.remove-orphans.interval-ms=1",
    )
    assert code == 0, err
    assert "remove-orphan-files" in next_actions(health())
