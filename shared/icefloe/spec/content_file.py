"""Content files as JSON, in the Iceberg REST catalog's ``ContentFile`` form.

This is the one JSON shape icefloe uses for data and delete files on the wire: in the
coordinator's files-written events and in the planner's scan tasks, which PyIceberg's REST
client parses. Partition values are a list in spec order, bounds are typed values keyed by
column id (``{"keys": [...], "values": [...]}``), binary values upper-case hex.

Reading also accepts the older Java form of the spec's appendix (partition as an object by
partition field id, bounds as hex of the binary form, ``DATA``-style content names), so
events produced by other tools are not refused for a spelling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from icefloe.errors import ValidationError
from icefloe.spec.datafile import DataFile, DataFileContent, FileFormat
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.types import BinaryType, FixedType, IcebergType, PrimitiveType
from icefloe.spec.values import from_bytes, from_json_value, to_bytes, to_json_value

_CONTENT_NAMES = {
    DataFileContent.DATA: "data",
    DataFileContent.POSITION_DELETES: "position-deletes",
    DataFileContent.EQUALITY_DELETES: "equality-deletes",
}
_CONTENT_BY_NAME = {name: c for c, name in _CONTENT_NAMES.items()} | {
    "DATA": DataFileContent.DATA,
    "POSITION_DELETES": DataFileContent.POSITION_DELETES,
    "EQUALITY_DELETES": DataFileContent.EQUALITY_DELETES,
}


def value_json(t: IcebergType, value: Any) -> Any:
    """A single value in the REST form (binary as upper-case hex), ready for ``json.dumps``."""
    if value is None:
        return None
    if isinstance(t, (FixedType, BinaryType)):
        return bytes(value).hex().upper()
    return to_json_value(t, value)


def _value_from_json(t: IcebergType, obj: Any) -> Any:
    if obj is None:
        return None
    if isinstance(t, (FixedType, BinaryType)) and isinstance(obj, str):
        try:
            return bytes.fromhex(obj)
        except ValueError:
            raise ValidationError(f"{t} value {obj!r} is not hexadecimal") from None
    return from_json_value(t, obj)


def _count_map(counts: Mapping[int, int] | None) -> dict[str, list[int]] | None:
    if counts is None:
        return None
    keys = sorted(counts)
    return {"keys": keys, "values": [counts[k] for k in keys]}


def _pairs(obj: Any, what: str, path: str) -> list[tuple[int, Any]]:
    if isinstance(obj, dict) and "keys" in obj and "values" in obj:
        keys, values = obj["keys"], obj["values"]
        if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values):
            raise ValidationError(f"{path}: {what} keys and values must be lists of equal length")
        pairs = list(zip(keys, values))
    elif isinstance(obj, dict):  # the appendix's {"<id>": value} spelling
        pairs = list(obj.items())
    else:
        raise ValidationError(f"{path}: {what} must be a {{keys, values}} object")
    out = []
    for k, v in pairs:
        try:
            out.append((int(k), v))
        except (TypeError, ValueError):
            raise ValidationError(f"{path}: {what} key {k!r} is not a column id") from None
    return out


def _counts_from_json(obj: Any, what: str, path: str) -> dict[int, int] | None:
    if obj is None:
        return None
    out = {}
    for k, v in _pairs(obj, what, path):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValidationError(f"{path}: {what}[{k}] must be a non-negative integer, got {v!r}")
        out[k] = v
    return out


def content_file_to_json(
    data_file: DataFile,
    spec: PartitionSpec,
    schema: Schema,
    stats_fields: set[int] | None = None,
) -> dict[str, Any]:
    """REST JSON for a content file; column stats only for ``stats_fields`` (None = all)."""
    partition_type = spec.partition_type(schema)
    out: dict[str, Any] = {
        "spec-id": data_file.spec_id,
        "content": _CONTENT_NAMES[data_file.content],
        "file-path": data_file.file_path,
        "file-format": data_file.file_format,
        "partition": [
            value_json(f.field_type, v) for f, v in zip(partition_type.fields, data_file.partition)
        ],
        "file-size-in-bytes": data_file.file_size_in_bytes,
        "record-count": data_file.record_count,
    }
    if data_file.key_metadata is not None:
        out["key-metadata"] = data_file.key_metadata.hex().upper()
    if data_file.split_offsets is not None:
        out["split-offsets"] = list(data_file.split_offsets)
    if data_file.sort_order_id is not None:
        out["sort-order-id"] = data_file.sort_order_id
    if data_file.content == DataFileContent.EQUALITY_DELETES:
        out["equality-ids"] = list(data_file.equality_ids or [])
    if data_file.content == DataFileContent.POSITION_DELETES:
        for key, value in (
            ("referenced-data-file", data_file.referenced_data_file),
            ("content-offset", data_file.content_offset),
            ("content-size-in-bytes", data_file.content_size_in_bytes),
        ):
            if value is not None:
                out[key] = value
    if data_file.first_row_id is not None:
        out["first-row-id"] = data_file.first_row_id

    def keep(counts: Mapping[int, Any] | None) -> Mapping[int, Any] | None:
        if counts is None or stats_fields is None:
            return counts
        return {k: v for k, v in counts.items() if k in stats_fields}

    for key, counts in (
        ("column-sizes", data_file.column_sizes),
        ("value-counts", data_file.value_counts),
        ("null-value-counts", data_file.null_value_counts),
        ("nan-value-counts", data_file.nan_value_counts),
    ):
        if (kept := _count_map(keep(counts))) is not None:
            out[key] = kept
    for key, bounds in (
        ("lower-bounds", data_file.lower_bounds),
        ("upper-bounds", data_file.upper_bounds),
    ):
        kept_bounds = keep(bounds)
        if kept_bounds is None:
            continue
        keys, values = [], []
        for fid in sorted(kept_bounds):
            field = schema.find_field(fid)
            if field is None or not isinstance(field.field_type, PrimitiveType):
                continue  # a dropped column: its bound can no longer be typed
            keys.append(fid)
            values.append(
                value_json(field.field_type, from_bytes(field.field_type, kept_bounds[fid]))
            )
        out[key] = {"keys": keys, "values": values}
    return out


def content_file_from_json(
    obj: Any, *, specs: Mapping[int, PartitionSpec], schema: Schema
) -> DataFile:
    """Parse a REST content file, checking it against the table's specs and schema.

    Every problem is a ValidationError naming the file path and the field.
    """
    if not isinstance(obj, dict):
        raise ValidationError(f"a content file must be a JSON object, got {type(obj).__name__}")
    path = obj.get("file-path")
    if not isinstance(path, str) or not path:
        raise ValidationError("content file is missing 'file-path'")

    def req(key: str) -> Any:
        if key not in obj:
            raise ValidationError(f"{path}: content file is missing {key!r}")
        return obj[key]

    def integer(key: str, value: Any, minimum: int | None = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError(f"{path}: {key!r} must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise ValidationError(f"{path}: {key!r} must be >= {minimum}, got {value}")
        return value

    content_name = obj.get("content", "data")
    content = _CONTENT_BY_NAME.get(content_name)
    if content is None:
        raise ValidationError(f"{path}: unknown content {content_name!r}")
    spec_id = integer("spec-id", req("spec-id"))
    spec = specs.get(spec_id)
    if spec is None:
        raise ValidationError(f"{path}: unknown partition spec id {spec_id}")
    file_format = req("file-format")
    if not isinstance(file_format, str):
        raise ValidationError(f"{path}: 'file-format' must be a string")
    try:
        file_format = FileFormat.parse(file_format)
    except ValidationError as e:
        raise ValidationError(f"{path}: {e}") from None

    partition_type = spec.partition_type(schema)
    raw_partition = obj.get("partition", [])
    if isinstance(raw_partition, dict):  # appendix form: {"1000": value}
        by_id = {str(k): v for k, v in raw_partition.items()}
        raw_partition = [by_id.get(str(f.field_id)) for f in partition_type.fields]
    if not isinstance(raw_partition, list) or len(raw_partition) != len(partition_type.fields):
        raise ValidationError(
            f"{path}: partition must list {len(partition_type.fields)} value(s) for spec "
            f"{spec_id}, got {raw_partition!r}"
        )
    partition = []
    for f, raw in zip(partition_type.fields, raw_partition):
        try:
            partition.append(_value_from_json(f.field_type, raw))
        except ValidationError as e:
            raise ValidationError(f"{path}: partition field {f.name!r}: {e}") from None

    hex_bounds = content_name.isupper()  # Java's appendix form stores bounds as binary hex
    bounds: dict[str, dict[int, bytes] | None] = {}
    for key in ("lower-bounds", "upper-bounds"):
        raw = obj.get(key)
        if raw is None:
            bounds[key] = None
            continue
        decoded: dict[int, bytes] = {}
        for fid, value in _pairs(raw, key, path):
            field = schema.find_field(fid)
            if field is None or not isinstance(field.field_type, PrimitiveType):
                raise ValidationError(
                    f"{path}: {key} names column id {fid}, not a primitive column"
                )
            try:
                if hex_bounds and isinstance(value, str):
                    decoded[fid] = bytes.fromhex(value)
                else:
                    decoded[fid] = to_bytes(
                        field.field_type, _value_from_json(field.field_type, value)
                    )
            except (ValidationError, ValueError) as e:
                raise ValidationError(f"{path}: {key}[{fid}] ({field.name}): {e}") from None
        bounds[key] = decoded

    key_metadata = obj.get("key-metadata")
    split_offsets = obj.get("split-offsets")
    equality_ids = obj.get("equality-ids")
    if split_offsets is not None and (
        not isinstance(split_offsets, list)
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in split_offsets)
    ):
        raise ValidationError(f"{path}: 'split-offsets' must be a list of integers")
    if equality_ids is not None and (
        not isinstance(equality_ids, list) or not all(isinstance(i, int) for i in equality_ids)
    ):
        raise ValidationError(f"{path}: 'equality-ids' must be a list of integers")

    def optional_int(key: str) -> int | None:
        value = obj.get(key)
        return None if value is None else integer(key, value, minimum=None)

    data_file = DataFile(
        file_path=path,
        file_format=file_format,
        partition=tuple(partition),
        record_count=integer("record-count", req("record-count")),
        file_size_in_bytes=integer("file-size-in-bytes", req("file-size-in-bytes")),
        content=content,
        spec_id=spec_id,
        column_sizes=_counts_from_json(obj.get("column-sizes"), "column-sizes", path),
        value_counts=_counts_from_json(obj.get("value-counts"), "value-counts", path),
        null_value_counts=_counts_from_json(
            obj.get("null-value-counts"), "null-value-counts", path
        ),
        nan_value_counts=_counts_from_json(obj.get("nan-value-counts"), "nan-value-counts", path),
        lower_bounds=bounds["lower-bounds"],
        upper_bounds=bounds["upper-bounds"],
        key_metadata=None if key_metadata is None else _value_from_json(BinaryType(), key_metadata),
        split_offsets=split_offsets,
        equality_ids=equality_ids,
        sort_order_id=optional_int("sort-order-id"),
        first_row_id=optional_int("first-row-id"),
        referenced_data_file=obj.get("referenced-data-file"),
        content_offset=optional_int("content-offset"),
        content_size_in_bytes=optional_int("content-size-in-bytes"),
    )
    data_file.validate()
    return data_file
