"""The one formatter of pydantic errors: every problem names its field and what was wrong."""

from __future__ import annotations

import pydantic
import pytest
from pydantic import StrictInt

from icefloe.errors import ValidationError
from icefloe.spec.model import IcebergModel, describe_problems


class _Inner(IcebergModel):
    snapshot_id: StrictInt


class _Outer(IcebergModel):
    format_version: StrictInt
    snapshots: list[_Inner]


def _error(obj: object) -> pydantic.ValidationError:
    with pytest.raises(pydantic.ValidationError) as info:
        _Outer.model_validate(obj)
    return info.value


def test_problems_name_the_field_by_its_json_path() -> None:
    text = describe_problems(_error({"format-version": "2", "snapshots": [{}]}))
    assert "format-version: input should be a valid integer (got '2')" in text
    assert "missing required field 'snapshot-id' in snapshots[0]" in text


def test_names_values_and_limit_are_the_callers_choice() -> None:
    err = _error({"format-version": "x", "snapshots": [{}, {}, {}]})
    text = describe_problems(err, lambda loc: f"field {'/'.join(map(str, loc))!r}", limit=2)
    assert text.startswith("field 'format-version': input should be a valid integer")
    assert "missing required field 'snapshots/0/snapshot-id'" in text
    assert text.endswith("; and 2 more problem(s)")
    assert "'x'" not in describe_problems(err, inputs=False)


def test_models_raise_one_icefloe_error_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"_Outer: snapshots\[0\]\.snapshot-id: input"):
        _Outer.from_json({"format-version": 2, "snapshots": [{"snapshot-id": "1"}]})
