"""Table metadata refuses what Java refuses: required fields missing, named in the message."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from icefloe.errors import ValidationError
from icefloe.spec.metadata import TableMetadata

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "conformance" / "table-metadata"


def _v1() -> dict[str, Any]:
    obj: dict[str, Any] = json.loads((FIXTURES / "V1Valid.json").read_text())
    return obj


def test_the_v1_fixture_parses() -> None:
    assert TableMetadata.from_json(_v1()).format_version == 1


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["schema"].pop("type"), r"schema is missing required field 'type'"),
        (lambda m: m["schema"].pop("fields"), r"schema is missing required field 'fields'"),
        (lambda m: m.pop("last-column-id"), r"'last-column-id'"),
        (lambda m: m.pop("location"), r"'location'"),
        (lambda m: m.pop("schema"), r"'schema'"),
        (lambda m: m.pop("partition-spec"), r"'partition-spec'"),
    ],
)
def test_v1_metadata_missing_a_required_field_is_refused_naming_it(edit: Any, message: str) -> None:
    obj = copy.deepcopy(_v1())
    edit(obj)
    with pytest.raises(ValidationError, match=message):
        TableMetadata.from_json(obj)


def test_v2_schema_without_type_is_refused_naming_its_index() -> None:
    obj = json.loads((FIXTURES / "V2Valid.json").read_text())
    obj["schemas"][-1].pop("type")
    with pytest.raises(ValidationError, match=r"schemas\[1\] is missing required field 'type'"):
        TableMetadata.from_json(obj)


def test_a_table_schema_may_not_use_reserved_metadata_column_ids() -> None:
    obj = json.loads((FIXTURES / "V2Valid.json").read_text())
    obj["schemas"][-1]["fields"].append(
        {"id": 2147483540, "name": "_row_id", "required": False, "type": "long"}
    )
    with pytest.raises(ValidationError, match="'_row_id' has id 2147483540, in the range reserved"):
        TableMetadata.from_json(obj)
