"""Tests for icefloe.events: the Kafka event contract (models, parsing, file decoding)."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import UnsupportedFormatVersion, ValidationError
from icefloe.events import (
    EVENT_VERSION,
    CommitOperation,
    CommitRequested,
    DeadLetter,
    Event,
    EventType,
    FilesWritten,
    TableCommitted,
    encode_event,
    event_key,
    parse_event,
)
from icefloe.expressions import BooleanExpression
from icefloe.spec.content_file import content_file_to_json
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import BucketTransform, DayTransform
from icefloe.spec.types import DoubleType, LongType, NestedField, StringType, TimestamptzType
from icefloe.spec.values import to_bytes
from icefloe.table.catalog import TableIdentifier

# -- a real table: schema 3, spec 0 unpartitioned, spec 1 = day(ts), bucket[8](id) ----------

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestamptzType()),
    NestedField(3, "data", StringType()),
    NestedField(4, "score", DoubleType()),
    schema_id=3,
)
UNPARTITIONED = PartitionSpec(0, ())
SPEC = PartitionSpec(
    1,
    (
        PartitionField(2, 1000, "ts_day", DayTransform()),
        PartitionField(1, 1001, "id_bucket", BucketTransform(8)),
    ),
)
SPECS = {0: UNPARTITIONED, 1: SPEC}
TABLE = "db.events"


def data_file(path: str = "s3://b/t/data/a.parquet", **changes: Any) -> DataFile:
    values: dict[str, Any] = {
        "file_path": path,
        "file_format": "parquet",
        "partition": (19000, 3),
        "record_count": 10,
        "file_size_in_bytes": 1024,
        "spec_id": 1,
        "value_counts": {1: 10, 3: 10},
        "null_value_counts": {1: 0, 3: 2},
        "lower_bounds": {1: to_bytes(LongType(), -5), 3: to_bytes(StringType(), "a")},
        "upper_bounds": {1: to_bytes(LongType(), 99), 3: to_bytes(StringType(), "zz")},
    }
    values.update(changes)
    return DataFile(**values)


def position_deletes(path: str = "s3://b/t/data/d.parquet", **changes: Any) -> DataFile:
    values: dict[str, Any] = {
        "content": DataFileContent.POSITION_DELETES,
        "referenced_data_file": "s3://b/t/data/a.parquet",
        "value_counts": None,
        "null_value_counts": None,
        "lower_bounds": None,
        "upper_bounds": None,
    }
    values.update(changes)
    return data_file(path, **values)


def files_written(**changes: Any) -> FilesWritten:
    args: dict[str, Any] = {
        "table": TABLE,
        "commit_id": "job-1",
        "writer_id": "task-7",
        "attempt_id": "job-1-attempt-0",
        "schema": SCHEMA,
        "spec": SPEC,
        "data_files": [data_file()],
    }
    args.update(changes)
    return FilesWritten.from_data_files(**args)


def wire(event: Event, **changes: Any) -> dict[str, Any]:
    """The event's JSON object with some fields replaced (None removes the field)."""
    obj: dict[str, Any] = json.loads(encode_event(event))
    for key, value in changes.items():
        if value is None:
            obj.pop(key, None)
        else:
            obj[key] = value
    return obj


def parse_obj(obj: Any) -> Event:
    return parse_event(json.dumps(obj).encode())


def commit_requested(**changes: Any) -> CommitRequested:
    fields: dict[str, Any] = {
        "table": TABLE,
        "commit_id": "job-1",
        "operation": CommitOperation.APPEND,
        "attempt_ids": ("job-1-attempt-0",),
    }
    fields.update(changes)
    return CommitRequested(**fields)


def table_committed(**changes: Any) -> TableCommitted:
    fields: dict[str, Any] = {
        "table": TABLE,
        "snapshot_id": 42,
        "sequence_number": 7,
        "metadata_location": "s3://b/t/metadata/00007-x.metadata.json",
        "commit_ids": ("job-1",),
        "added_data_files": 1,
        "added_records": 10,
        "latency_ms": 12,
    }
    fields.update(changes)
    return TableCommitted(**fields)


# -- hypothesis strategies ---------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8"), min_size=1, max_size=20)
names = st.text("abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=10)
tables = st.lists(names, min_size=2, max_size=3).map(".".join)
counts = st.integers(0, (1 << 63) - 1)
longs = st.integers(-(1 << 63), (1 << 63) - 1)
small_counts = st.integers(0, 10**6)
id_lists = st.lists(texts, max_size=4, unique=True).map(tuple)
properties = st.dictionaries(
    names.filter(lambda k: k != "operation" and not k.startswith("icefloe.")), texts, max_size=3
)
timestamps = st.integers(0, 4_102_444_800_000)


@st.composite
def data_files_for(draw: st.DrawFn, content: DataFileContent, path: str) -> DataFile:
    record_count = draw(small_counts)
    field_ids = draw(st.lists(st.sampled_from([1, 2, 3, 4]), unique=True, max_size=4))
    value_counts = {fid: draw(small_counts) for fid in field_ids}
    null_counts = {fid: draw(st.integers(0, value_counts[fid])) for fid in field_ids}
    lower: dict[int, bytes] = {}
    upper: dict[int, bytes] = {}
    bound_values: dict[int, tuple[Any, st.SearchStrategy[Any]]] = {
        1: (LongType(), longs),
        2: (TimestamptzType(), st.integers(-(10**15), 10**16)),
        3: (StringType(), st.text(st.characters(codec="utf-8"), max_size=8)),
        4: (DoubleType(), st.floats(allow_nan=False, allow_infinity=False)),
    }
    for fid in field_ids:
        t, values = bound_values[fid]
        low, high = sorted([draw(values), draw(values)])
        lower[fid], upper[fid] = to_bytes(t, low), to_bytes(t, high)
    spec_id = 1 if content == DataFileContent.DATA else draw(st.sampled_from([0, 1]))
    partition: tuple[Any, ...] = ()
    if spec_id == 1:
        partition = (
            draw(st.none() | st.integers(-25_000, 60_000)),
            draw(st.none() | st.integers(0, 7)),
        )
    return DataFile(
        file_path=path,
        file_format=draw(st.sampled_from(["parquet", "avro", "orc"])),
        partition=partition,
        record_count=record_count,
        file_size_in_bytes=draw(small_counts),
        content=content,
        spec_id=spec_id,
        column_sizes=draw(st.none() | st.dictionaries(st.sampled_from([1, 2, 3, 4]), counts)),
        value_counts=value_counts if field_ids else None,
        null_value_counts=null_counts if field_ids else None,
        lower_bounds=lower if field_ids else None,
        upper_bounds=upper if field_ids else None,
        key_metadata=draw(st.none() | st.binary(max_size=8)),
        split_offsets=draw(st.none() | st.lists(small_counts, max_size=3).map(sorted)),
        equality_ids=[1] if content == DataFileContent.EQUALITY_DELETES else None,
        sort_order_id=draw(st.none() | st.integers(0, 3)),
    )


@st.composite
def file_lists(draw: st.DrawFn) -> tuple[list[DataFile], list[DataFile]]:
    n_data = draw(st.integers(0, 3))
    kinds = draw(
        st.lists(
            st.sampled_from([DataFileContent.POSITION_DELETES, DataFileContent.EQUALITY_DELETES]),
            max_size=2,
        )
    )
    data = [
        draw(data_files_for(DataFileContent.DATA, f"s3://b/t/data/{i}.parquet"))
        for i in range(n_data)
    ]
    deletes = [
        draw(data_files_for(kind, f"s3://b/t/data/del-{i}.parquet")) for i, kind in enumerate(kinds)
    ]
    return data, deletes


@st.composite
def files_written_events(draw: st.DrawFn) -> FilesWritten:
    data, deletes = draw(file_lists())
    complete = draw(st.booleans())
    return FilesWritten.from_data_files(
        draw(tables),
        draw(texts),
        draw(texts),
        draw(texts),
        SCHEMA,
        SPEC,
        data,
        deletes,
        complete,
        specs=SPECS,
        snapshot_properties=draw(st.none() | properties) if complete else None,
        branch=draw(st.none() | names) if complete else None,
        event_id=draw(texts),
        produced_at_ms=draw(timestamps),
    )


filters: st.SearchStrategy[Any] = st.sampled_from(
    [
        True,
        False,
        {"type": "eq", "term": "id", "value": 5},
        {"type": "lt", "left": {"type": "reference", "name": "ts"}, "right": "2020-01-01"},
        {"type": "and", "left": {"type": "is-null", "term": "data"}, "right": True},
    ]
)


@st.composite
def commit_requested_events(draw: st.DrawFn) -> CommitRequested:
    op = draw(st.sampled_from(list(CommitOperation)))
    event_ids = draw(id_lists)
    attempt_ids = draw(id_lists)
    if op != CommitOperation.REWRITE and not (event_ids or attempt_ids):
        event_ids = ("e-1",)
    return CommitRequested(
        event_id=draw(texts),
        produced_at_ms=draw(timestamps),
        table=draw(tables),
        commit_id=draw(texts),
        operation=op,
        event_ids=event_ids,
        attempt_ids=attempt_ids,
        overwrite_filter=draw(st.none() | filters) if op == CommitOperation.OVERWRITE else None,
        rewritten_files=(
            draw(st.lists(texts, min_size=1, max_size=3, unique=True).map(tuple))
            if op == CommitOperation.REWRITE
            else ()
        ),
        snapshot_properties=draw(properties),
        branch=draw(st.none() | names),
        base_snapshot_id=draw(st.none() | longs),
    )


@st.composite
def table_committed_events(draw: st.DrawFn) -> TableCommitted:
    return TableCommitted(
        event_id=draw(texts),
        produced_at_ms=draw(timestamps),
        table=draw(tables),
        branch=draw(names),
        snapshot_id=draw(longs),
        sequence_number=draw(counts),
        metadata_location=draw(texts),
        commit_ids=draw(st.lists(texts, min_size=1, max_size=4, unique=True).map(tuple)),
        added_data_files=draw(counts),
        added_delete_files=draw(counts),
        removed_data_files=draw(counts),
        removed_delete_files=draw(counts),
        added_records=draw(counts),
        added_files_size=draw(counts),
        latency_ms=draw(counts),
        orphan_files=draw(st.lists(texts, max_size=3).map(tuple)),
    )


@st.composite
def dead_letter_events(draw: st.DrawFn) -> DeadLetter:
    return DeadLetter.for_bytes(
        draw(st.binary(max_size=64)),
        draw(texts),
        draw(texts),
        draw(st.integers(0, 2**31 - 1)),
        draw(counts),
        key=draw(st.none() | st.binary(max_size=16)),
        table=draw(st.none() | tables),
    )


any_event = st.one_of(
    files_written_events(),
    commit_requested_events(),
    table_committed_events(),
    dead_letter_events(),
)


# -- round trips -------------------------------------------------------------------------


@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(any_event)
def test_every_event_round_trips_through_its_bytes(event: Event) -> None:
    data = encode_event(event)
    parsed = parse_event(data)
    assert type(parsed) is type(event)
    assert parsed == event
    assert encode_event(parsed) == data


@settings(max_examples=examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(files_written_events())
def test_decode_files_returns_the_files_that_were_encoded(event: FilesWritten) -> None:
    # Rebuild the DataFiles the strategy drew from the raw JSON and compare both ways:
    # decoding then re-encoding gives back the same JSON the writer produced.
    parsed = parse_event(encode_event(event))
    assert isinstance(parsed, FilesWritten)
    data, deletes = parsed.decode_files(SCHEMA, SPECS)
    assert [content_file_to_json(f, SPEC, SCHEMA) for f in data] == list(event.data_files)
    assert [content_file_to_json(f, SPECS[f.spec_id], SCHEMA) for f in deletes] == list(
        event.delete_files
    )
    assert all(f.content == DataFileContent.DATA for f in data)
    assert all(f.content != DataFileContent.DATA for f in deletes)


@settings(max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow])
@given(file_lists())
def test_data_files_survive_encode_and_decode(files: tuple[list[DataFile], list[DataFile]]) -> None:
    data, deletes = files
    event = files_written(data_files=data, delete_files=deletes, specs=SPECS)
    parsed = parse_event(encode_event(event))
    assert isinstance(parsed, FilesWritten)
    assert parsed.decode_files(SCHEMA, SPECS) == (data, deletes)


def test_wire_form_uses_hyphenated_names_and_leaves_out_absent_fields() -> None:
    event = files_written(event_id="e-1", produced_at_ms=1_700_000_000_000)
    obj = json.loads(encode_event(event))
    assert list(obj)[:2] == ["type", "version"]
    assert obj["type"] == "files-written"
    assert obj["version"] == EVENT_VERSION
    assert obj["event-id"] == "e-1"
    assert obj["produced-at-ms"] == 1_700_000_000_000
    assert obj["commit-id"] == "job-1"
    assert obj["attempt-id"] == "job-1-attempt-0"
    assert obj["schema-id"] == 3
    assert obj["spec-id"] == 1
    assert obj["data-files"][0]["file-path"] == "s3://b/t/data/a.parquet"
    assert obj["data-files"][0]["partition"] == ["2022-01-08", 3]
    assert "branch" not in obj
    assert "snapshot-properties" not in obj
    assert b" " not in encode_event(commit_requested())


def test_parse_ignores_fields_added_within_the_same_version() -> None:
    event = commit_requested()
    assert parse_obj(wire(event, **{"future-field": {"x": 1}})) == event


def test_new_events_get_an_id_and_a_time() -> None:
    a, b = commit_requested(), commit_requested()
    assert a.event_id and b.event_id and a.event_id != b.event_id
    assert a.produced_at_ms > 1_600_000_000_000
    assert a.type == EventType.COMMIT_REQUESTED
    assert a.target_branch == "main"


def test_dead_letter_keeps_the_original_bytes_exactly() -> None:
    original = b"\xff\xfe not json \x00"
    dead = DeadLetter.for_bytes(original, "not UTF-8", "icefloe.files", 3, 1234, key=b"db.t")
    obj = json.loads(encode_event(dead))
    assert base64.b64decode(obj["original"]) == original
    assert base64.b64decode(obj["original-key"]) == b"db.t"
    assert (obj["source-topic"], obj["source-partition"], obj["source-offset"]) == (
        "icefloe.files",
        3,
        1234,
    )
    parsed = parse_event(encode_event(dead))
    assert isinstance(parsed, DeadLetter)
    assert parsed.original == original
    assert "table" not in obj


def test_event_key_is_the_table_identifier() -> None:
    assert event_key("db.events") == b"db.events"
    assert event_key(TableIdentifier(("a", "b"), "t")) == b"a.b.t"
    with pytest.raises(ValidationError, match="invalid table identifier 'nodot'"):
        event_key("nodot")


@pytest.mark.parametrize("bad", ["nodot", "a..b", ".t", "ns.", ""])
def test_table_identifiers_need_non_empty_parts(bad: str) -> None:
    with pytest.raises(ValidationError, match=r"field 'table': invalid table identifier"):
        parse_obj(wire(commit_requested(), table=bad))


def test_multi_level_namespaces_are_accepted() -> None:
    event = commit_requested(table="a.b.t")
    assert event.identifier == TableIdentifier(("a", "b"), "t")


# -- parse errors ------------------------------------------------------------------------


def test_bytes_that_are_not_utf8_are_refused() -> None:
    with pytest.raises(ValidationError, match="not UTF-8"):
        parse_event(b'{"type": "\xff"}')


@pytest.mark.parametrize("data", [b"", b"{", b"{'type': 1}", b"nan-sense"])
def test_bytes_that_are_not_json_are_refused(data: bytes) -> None:
    with pytest.raises(ValidationError, match="not valid JSON"):
        parse_event(data)


@pytest.mark.parametrize("data", [b"[]", b"1", b'"files-written"', b"null"])
def test_json_that_is_not_an_object_is_refused(data: bytes) -> None:
    with pytest.raises(ValidationError, match="must be a JSON object"):
        parse_event(data)


def test_unknown_type_names_the_type_and_the_known_ones() -> None:
    with pytest.raises(ValidationError, match=r"field 'type': unknown event type 'files-read'.*"):
        parse_obj(wire(commit_requested(), type="files-read"))
    with pytest.raises(ValidationError, match="unknown event type 5"):
        parse_obj(wire(commit_requested(), type=5))


@pytest.mark.parametrize("field", ["type", "version", "event-id", "produced-at-ms"])
def test_envelope_fields_are_required_on_the_wire(field: str) -> None:
    with pytest.raises(ValidationError, match=f"missing required field '{field}'"):
        parse_obj(wire(commit_requested(), **{field: None}))


@pytest.mark.parametrize("version", [0, 2, 17])
def test_other_major_versions_are_refused_naming_the_version(version: int) -> None:
    # A v2 event may look nothing like v1, so only the version is read.
    obj = {"type": "files-written", "version": version, "event-id": "e", "produced-at-ms": 1}
    with pytest.raises(UnsupportedFormatVersion, match=f"version {version} is not supported"):
        parse_obj(obj)


@pytest.mark.parametrize("version", ["1", 1.0, True, None])
def test_version_must_be_an_integer(version: Any) -> None:
    obj = wire(commit_requested())
    obj["version"] = version
    with pytest.raises(ValidationError, match="'version'"):
        parse_obj(obj)


def test_building_an_event_of_another_version_is_refused() -> None:
    with pytest.raises(UnsupportedFormatVersion, match="field 'version': version 2"):
        commit_requested(version=2)


@pytest.mark.parametrize(
    "field",
    ["table", "commit-id", "writer-id", "attempt-id", "schema-id", "spec-id"],
)
def test_missing_files_written_fields_are_named(field: str) -> None:
    with pytest.raises(ValidationError, match=f"missing required field '{field}'"):
        parse_obj(wire(files_written(), **{field: None}))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("schema-id", "3"),
        ("spec-id", 1.5),
        ("schema-id", True),
        ("commit-id", 7),
        ("writer-id", ""),
        ("complete", "yes"),
        ("data-files", {"file-path": "x"}),
        ("data-files", ["s3://b/x.parquet"]),
        ("produced-at-ms", -1),
        ("event-id", ""),
        ("spec-id", -1),
    ],
)
def test_wrong_files_written_values_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=rf"files-written event[^:]*: field '{field}"):
        parse_obj(wire(files_written(), **{field: value}))


def test_a_content_file_without_a_path_is_refused_at_parse_time() -> None:
    obj = wire(files_written())
    del obj["data-files"][0]["file-path"]
    with pytest.raises(ValidationError, match=r"field 'data-files': content file \[0\] has no"):
        parse_obj(obj)


def test_a_file_listed_twice_is_refused() -> None:
    event = files_written()
    obj = wire(event)
    obj["delete-files"] = [dict(obj["data-files"][0], content="position-deletes")]
    with pytest.raises(ValidationError, match=r"delete-files\[0\]: file 's3://b/t/data/a\.parquet"):
        parse_obj(obj)


@pytest.mark.parametrize("field", ["snapshot-properties", "branch"])
def test_commit_fields_need_a_complete_files_written(field: str) -> None:
    value: Any = {"k": "v"} if field == "snapshot-properties" else "audit"
    obj = wire(files_written(), **{field: value})
    with pytest.raises(ValidationError, match=f"'{field}' is only allowed with 'complete': true"):
        parse_obj(obj)
    obj["complete"] = True
    assert isinstance(parse_obj(obj), FilesWritten)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("snapshot-id", "42"),
        ("snapshot-id", 1 << 63),
        ("sequence-number", -1),
        ("added-data-files", -1),
        ("added-records", -3),
        ("added-files-size", 1.5),
        ("latency-ms", -1),
        ("commit-ids", []),
        ("commit-ids", ["a", "a"]),
        ("metadata-location", ""),
        ("orphan-files", "s3://x"),
    ],
)
def test_wrong_table_committed_values_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=rf"table-committed event '[^']+': field '{field}'"):
        parse_obj(wire(table_committed(), **{field: value}))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("original", "not base64!", "is not valid base64"),
        ("original", 12, "must be a base64 string"),
        ("original-key", "@@", "is not valid base64"),
        ("source-partition", -1, "greater than or equal to 0"),
        ("source-offset", "5", "valid integer"),
        ("reason", "", "at least 1 character"),
        ("table", "x", "invalid table identifier"),
    ],
)
def test_wrong_dead_letter_values_name_the_field(field: str, value: Any, message: str) -> None:
    dead = DeadLetter.for_bytes(b"x", "why", "topic", 0, 0, key=b"k", table="a.b")
    with pytest.raises(ValidationError, match=rf"field '{field}': .*{message}"):
        parse_obj(wire(dead, **{field: value}))


def test_several_problems_are_reported_together_but_briefly() -> None:
    obj = {"type": "table-committed", "version": 1, "event-id": "e9", "produced-at-ms": 0}
    with pytest.raises(ValidationError) as info:
        parse_obj(obj)
    message = str(info.value)
    assert message.startswith("invalid table-committed event 'e9': missing required field")
    assert "more problem(s)" in message


def test_building_a_bad_event_in_code_raises_the_icefloe_error() -> None:
    with pytest.raises(ValidationError, match="sequence_number"):
        table_committed(sequence_number=-1)


# -- commit-requested rules --------------------------------------------------------------


def test_overwrite_filter_is_kept_raw_and_parsed_on_demand() -> None:
    raw = {"type": "eq", "term": "id", "value": 5}
    event = commit_requested(operation=CommitOperation.OVERWRITE, overwrite_filter=raw)
    parsed = parse_event(encode_event(event))
    assert isinstance(parsed, CommitRequested)
    assert parsed.overwrite_filter == raw
    assert isinstance(parsed.overwrite_expression(), BooleanExpression)
    assert commit_requested().overwrite_expression() is None


def test_an_overwrite_may_only_delete() -> None:
    event = commit_requested(
        operation=CommitOperation.OVERWRITE, attempt_ids=(), overwrite_filter=True
    )
    assert parse_event(encode_event(event)) == event


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"overwrite-filter": {"type": "eq", "term": "id", "value": 1}},
            "only allowed for overwrite",
        ),
        ({"rewritten-files": ["s3://x"]}, "only allowed for rewrite"),
        ({"attempt-ids": []}, "append names no files"),
        ({"operation": "row-delta", "attempt-ids": []}, "row-delta names no files"),
        ({"operation": "rewrite"}, "must list the files it replaces in 'rewritten-files'"),
        ({"operation": "overwrite", "attempt-ids": []}, "needs an 'overwrite-filter' or files"),
        ({"operation": "merge"}, "field 'operation': input should be 'append'"),
        ({"operation": "overwrite", "overwrite-filter": {"type": "like"}}, "'overwrite-filter'"),
        ({"operation": "overwrite", "overwrite-filter": [1]}, "field 'overwrite-filter"),
        ({"event-ids": ["e", "e"]}, "field 'event-ids': 'e' is listed twice"),
        ({"attempt-ids": [""]}, "field 'attempt-ids\\[0\\]'"),
        ({"snapshot-properties": {"k": 1}}, "field 'snapshot-properties.k'"),
        ({"snapshot-properties": {"icefloe.commit-ids": "x"}}, "reserved for the coordinator"),
        ({"snapshot-properties": {"operation": "delete"}}, "reserved for the coordinator"),
        ({"base-snapshot-id": "12"}, "field 'base-snapshot-id'"),
        ({"branch": ""}, "field 'branch'"),
    ],
)
def test_commit_requested_rules(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_obj(wire(commit_requested(), **changes))


def test_a_commit_takes_only_the_named_attempts_and_reports_the_rest() -> None:
    good = files_written(attempt_id="a1", event_id="e1")
    other_attempt = files_written(
        attempt_id="a0", event_id="e0", data_files=[data_file("s3://b/t/data/old.parquet")]
    )
    other_commit = files_written(commit_id="job-2", attempt_id="a1", event_id="e2")
    other_table = files_written(table="db.other", attempt_id="a1", event_id="e3")
    streaming = files_written(attempt_id="a1", event_id="e4", complete=True)
    request = commit_requested(attempt_ids=("a1",))
    selection = request.select([good, other_attempt, other_commit, other_table, streaming, good])
    assert selection.selected == (good,)
    assert selection.excluded == (other_attempt,)
    assert selection.orphan_files == ["s3://b/t/data/old.parquet"]
    assert selection.missing_event_ids == frozenset()
    assert request.selects(good) and not request.selects(other_attempt)


def test_a_commit_by_event_ids_knows_which_events_have_not_arrived() -> None:
    seen = files_written(event_id="e1")
    request = commit_requested(attempt_ids=(), event_ids=("e1", "e2"))
    selection = request.select([seen])
    assert selection.selected == (seen,)
    assert selection.missing_event_ids == frozenset({"e2"})


def test_a_complete_files_written_is_a_commit_of_its_own() -> None:
    append = files_written(complete=True, snapshot_properties={"flink.checkpoint": "9"})
    request = append.as_commit_request()
    assert request.operation == CommitOperation.APPEND
    assert request.event_ids == (append.event_id,)
    assert request.snapshot_properties == {"flink.checkpoint": "9"}
    assert request.select([append]).selected == ()  # complete events are not selectable
    delta = files_written(complete=True, delete_files=[position_deletes()], branch="audit")
    request = delta.as_commit_request()
    assert request.operation == CommitOperation.ROW_DELTA
    assert request.target_branch == "audit"
    with pytest.raises(ValidationError, match="is not complete"):
        files_written().as_commit_request()


# -- decode_files against the table --------------------------------------------------------


def test_decode_files_against_a_partitioned_spec() -> None:
    event = files_written(
        data_files=[data_file(), data_file("s3://b/t/data/b.parquet", partition=(None, 0))],
        delete_files=[
            position_deletes(),
            position_deletes("s3://b/t/d0.parquet", spec_id=0, partition=()),
        ],
        specs=SPECS,
    )
    parsed = parse_event(encode_event(event))
    assert isinstance(parsed, FilesWritten)
    data, deletes = parsed.decode_files(SCHEMA, SPECS)
    assert [f.partition for f in data] == [(19000, 3), (None, 0)]
    assert data[0].lower_bounds == {1: to_bytes(LongType(), -5), 3: b"a"}
    assert [(f.spec_id, f.content) for f in deletes] == [
        (1, DataFileContent.POSITION_DELETES),
        (0, DataFileContent.POSITION_DELETES),
    ]
    assert parsed.file_paths == [
        "s3://b/t/data/a.parquet",
        "s3://b/t/data/b.parquet",
        "s3://b/t/data/d.parquet",
        "s3://b/t/d0.parquet",
    ]


def mangle(key: str, index: int, **changes: Any) -> FilesWritten:
    """A parsed files-written whose content file ``key[index]`` has ``changes`` applied."""
    obj = wire(files_written(delete_files=[position_deletes()], event_id="ev-1"))
    entry = obj[key][index]
    for field, value in changes.items():
        if value is None:
            entry.pop(field, None)
        else:
            entry[field] = value
    event = parse_obj(obj)
    assert isinstance(event, FilesWritten)
    return event


@pytest.mark.parametrize(
    ("key", "changes", "message"),
    [
        ("data-files", {"record-count": -1}, "'record-count' must be >= 0"),
        ("data-files", {"file-size-in-bytes": -5}, "'file-size-in-bytes' must be >= 0"),
        ("data-files", {"record-count": None}, "missing 'record-count'"),
        (
            "data-files",
            {"value-counts": {"keys": [1], "values": [-2]}},
            "value-counts\\[1\\] must be a non-negative integer",
        ),
        ("data-files", {"partition": ["not-a-date", 3]}, "partition field 'ts_day'"),
        ("data-files", {"partition": ["2020-01-01"]}, "partition must list 2 value"),
        ("data-files", {"spec-id": 9}, "unknown partition spec id 9"),
        ("data-files", {"spec-id": 0, "partition": []}, "'spec-id' is 0, but the event's is 1"),
        (
            "data-files",
            {"lower-bounds": {"keys": [77], "values": [1]}},
            "lower-bounds names column id 77",
        ),
        (
            "data-files",
            {"upper-bounds": {"keys": [1], "values": ["x"]}},
            "upper-bounds\\[1\\] \\(id\\)",
        ),
        ("data-files", {"file-format": "csv"}, "unknown file format 'csv'"),
        ("data-files", {"content": "position-deletes"}, "does not belong in data-files"),
        ("delete-files", {"content": "data"}, "content 'data' does not belong in delete-files"),
        ("delete-files", {"record-count": -1}, "'record-count' must be >= 0"),
    ],
)
def test_malformed_content_files_name_the_event_and_the_file(
    key: str, changes: dict[str, Any], message: str
) -> None:
    event = mangle(key, 0, **changes)
    path = (
        event.data_files[0]["file-path"]
        if key == "data-files"
        else event.delete_files[0]["file-path"]
    )
    with pytest.raises(ValidationError) as info:
        event.decode_files(SCHEMA, SPECS)
    text = str(info.value)
    assert text.startswith(f"files-written event 'ev-1': {key}[0]: ")
    assert path in text
    assert re.search(message, text), text


def test_decode_files_needs_the_schema_the_writer_used() -> None:
    event = files_written()
    with pytest.raises(ValidationError, match="written with schema 3, but schema 0 was given"):
        event.decode_files(SCHEMA.with_id(0), SPECS)


def test_decode_files_needs_the_events_spec() -> None:
    event = files_written()
    with pytest.raises(
        ValidationError, match=r"'spec-id' 1 is not a partition spec of table db\.events"
    ):
        event.decode_files(SCHEMA, {0: UNPARTITIONED})


# -- from_data_files checks before publishing ------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"data_files": [position_deletes()]}, "data-files\\[0\\] .*position_deletes file cannot"),
        (
            {"delete_files": [data_file("s3://b/x.parquet")]},
            "delete-files\\[0\\] .*data file cannot",
        ),
        (
            {"data_files": [data_file(spec_id=0, partition=())], "specs": SPECS},
            "written with spec 0",
        ),
        ({"data_files": [data_file(partition=(1,))]}, "partition has 1 value\\(s\\), spec 1 has 2"),
        ({"delete_files": [position_deletes(spec_id=4)]}, "spec id 4 is not among the given specs"),
        ({"data_files": [data_file(record_count=-1)]}, "record_count is negative"),
        ({"table": "flat"}, "invalid table identifier 'flat'"),
        ({"commit_id": ""}, "commit_id"),
        ({"snapshot_properties": {"x": "y"}}, "only allowed with 'complete': true"),
    ],
)
def test_from_data_files_refuses_what_the_coordinator_would(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        files_written(**changes)


# -- fuzzing: nothing but icefloe's ValidationError ever escapes -----------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])
@given(any_event, st.data())
def test_corrupted_events_fail_only_with_validation_errors(
    event: Event, data: st.DataObject
) -> None:
    obj = wire(event)
    key = data.draw(st.sampled_from(sorted(obj)))
    obj[key] = data.draw(json_values)
    try:
        parsed = parse_obj(obj)
    except ValidationError as e:
        assert str(e)
    else:
        assert parse_event(encode_event(parsed)) == parsed


@settings(max_examples=examples(100))
@given(st.binary(max_size=64))
def test_arbitrary_bytes_fail_only_with_validation_errors(data: bytes) -> None:
    with pytest.raises(ValidationError):
        parse_event(data)
