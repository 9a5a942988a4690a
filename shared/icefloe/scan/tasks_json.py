"""A plan's tasks as the REST catalog's ``ScanTasks`` JSON, written column by column.

A full plan of a million files is a million ``file-scan-tasks``. Building a ``DataFile``,
then a dict, then JSON text per file costs tens of microseconds each: most of a warm full
plan. :func:`scan_tasks_wrapped` writes the same JSON from the plan's Arrow columns instead:
each field of the ``data-file`` object is one string array made by Arrow kernels (numbers
cast to text, paths quoted, partition values and file formats converted once per distinct
value and spread with ``take``), and one ``binary_join_element_wise`` glues the fields into
one text per task, whose bytes are the page. Residual filters are computed once per
distinct partition; column stats a plan asks for (``stats-fields``) are counts cast by Arrow
and bounds converted once per distinct stored value; delete files are attached by the
snapshot's :class:`~icefloe.deletes.index.DeleteFileIndex` only to the rows an Arrow test says
may have one (a path a deletion vector names, a partition with scoped deletes, a sequence
number below a global equality delete's), so the index's rules stay the one implementation.

:func:`scan_tasks_json` is the reference: the same object built per file from ``DataFile``
objects. The tests hold both to the same output on plans with deletes, column stats, evolved
partition specs and pages.

Why one module past 800 lines: the column-wise writer and its per-file reference are two
implementations of one output, held to the same bytes by the tests; they stay side by side.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icefloe.arrow.values import arrow_to_values, decode_bounds
from icefloe.deletes.index import path_bounds, same_partition
from icefloe.expressions import AlwaysTrue, BooleanExpression
from icefloe.expressions.json_form import expression_to_json
from icefloe.manifests.cached import CachedManifest
from icefloe.manifests.manifest_list import ManifestContent
from icefloe.scan.plan import ScanPlan
from icefloe.spec.content_file import content_file_to_json, value_json
from icefloe.spec.datafile import DataFile
from icefloe.spec.types import IcebergType, IntegerType, LongType, PrimitiveType
from icefloe.spec.values import from_bytes

_STATS_KEYS = (
    "column-sizes",
    "value-counts",
    "null-value-counts",
    "nan-value-counts",
    "lower-bounds",
    "upper-bounds",
)
# Characters JSON requires escaped in a string: quote, backslash and control characters.
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'
_NEEDS_ESCAPE_RE = re.compile(_NEEDS_ESCAPE)
# Grouping rows by partition packs each field's dictionary index into one int64 key.
_MAX_KEY = 1 << 62


# ---------------------------------------------------------------------------------------------
# The reference: per file, from DataFile objects
# ---------------------------------------------------------------------------------------------


def content_file_json(f: DataFile, plan: ScanPlan, stats: frozenset[int]) -> dict[str, Any]:
    """A data or delete file in REST form, with column stats only for ``stats`` (ids)."""
    out = content_file_to_json(f, plan.specs[f.spec_id], plan.schema, set(stats))
    for key in _STATS_KEYS:
        value = out.get(key)
        if value is not None and not value["keys"]:
            del out[key]
    return out


def same_filter(residual: Any, row_filter: Any) -> bool:
    """Whether a task's residual is the request's filter (then the task omits it)."""
    if residual is row_filter:
        return True
    try:
        return bool(residual == row_filter)
    except (TypeError, ValueError, RecursionError):
        return False


def residual_member(plan: ScanPlan, residual: BooleanExpression) -> str | None:
    """``,"residual-filter":…`` of a task whose residual is ``residual``, or None where it is
    the plan's filter (the task omits it). Written once per distinct residual object of the
    plan, whatever the number of tasks, pages or threads writing them: a residual that
    keeps most of a large filter is tens of kilobytes of JSON."""
    key = id(residual)
    found = plan.residual_texts.get(key)
    if found is not None and found[0] is residual:
        return found[1]
    text = (
        None
        if same_filter(residual, plan.row_filter)
        else ',"residual-filter":'
        + json.dumps(expression_to_json(residual, legacy=True), separators=(",", ":"))
    )
    size = 64 if text is None else 64 + len(text)
    if plan.residual_text_bytes + size <= RESIDUAL_TEXTS_MAX_BYTES:
        plan.residual_texts[key] = (residual, text)
        plan.residual_text_bytes += size
    return text


# Serialized residuals a plan keeps (see residual_member): a few distinct residuals per
# plan in practice; past this, further distinct ones are written each time they are met.
RESIDUAL_TEXTS_MAX_BYTES = 4 << 20


class _DeleteFiles:
    """The page's ``delete-files`` list: each delete file once, referenced by position.

    A deletion vector is one blob of a Puffin file that may hold many, so a delete file is
    known by its path and blob offset, not by its path alone.
    """

    def __init__(self, plan: ScanPlan) -> None:
        self.plan = plan
        self.files: list[dict[str, Any]] = []
        self._index: dict[tuple[str, int | None], int] = {}

    def refs(self, deletes: list[DataFile]) -> list[int]:
        out = []
        for d in deletes:
            key = (d.file_path, d.content_offset)
            index = self._index.get(key)
            if index is None:
                index = self._index[key] = len(self.files)
                self.files.append(content_file_json(d, self.plan, frozenset()))
            out.append(index)
        return out


def scan_tasks_json(plan: ScanPlan, start: int, stop: int) -> dict[str, Any]:
    """The ``ScanTasks`` object of tasks ``start``..``stop``, built per file (reference)."""
    # Equality deletes are ruled out by the data file's metrics, so those are read then.
    with_metrics = bool(plan.stats_field_ids) or plan.deletes.has_equality_deletes()
    tasks = plan.tasks(start, stop, with_metrics=with_metrics)
    deletes = _DeleteFiles(plan)
    file_tasks = []
    residuals: dict[Any, Any] = {}
    for task in tasks:
        refs = deletes.refs(list(task.delete_files))
        entry: dict[str, Any] = {
            "data-file": content_file_json(task.data_file, plan, plan.stats_field_ids),
        }
        # The spec lets a task omit its residual when it is the request's filter (the client
        # then applies that filter): repeating a large filter in every task would multiply
        # the response by the task count.
        if not same_filter(task.residual, plan.row_filter):
            residual = residuals.get(task.residual)
            if residual is None:
                residual = residuals[task.residual] = expression_to_json(task.residual, legacy=True)
            entry["residual-filter"] = residual
        if refs:
            entry["delete-file-references"] = refs
        file_tasks.append(entry)
    out: dict[str, Any] = {"file-scan-tasks": file_tasks}
    if deletes.files:
        out["delete-files"] = deletes.files
    return out


# ---------------------------------------------------------------------------------------------
# Column by column
# ---------------------------------------------------------------------------------------------


def scan_tasks_wrapped(
    plan: ScanPlan, start: int, stop: int, prefix: bytes, suffix: bytes
) -> bytes:
    """``prefix``, the members of the ``ScanTasks`` object of tasks ``start``..``stop``
    (``"file-scan-tasks":[…]`` and, when deletes apply, ``,"delete-files":[…]``), then
    ``suffix``, joined in one copy: a page of a full plan is megabytes, and every
    concatenation of it costs a fresh allocation of that size (for a server, the response
    body is ``{``, members, ``}``). The same JSON value as :func:`scan_tasks_json`."""
    deletes = _DeleteFiles(plan)
    chunks: list[Any] = [prefix, b'"file-scan-tasks":[']
    chunks += [_piece(plan, m, rows, deletes) for m, rows in plan.pieces(start, stop)]
    last = len(chunks) - 1
    while last > 1 and not len(chunks[last]):
        last -= 1
    if last > 1:
        chunks[last] = memoryview(chunks[last])[:-1]  # each task text ends with a comma
    chunks.append(b"]")
    if deletes.files:
        files = json.dumps(deletes.files, separators=(",", ":")).encode("utf-8")
        chunks += [b',"delete-files":', files]
    chunks.append(suffix)
    return b"".join(chunks)


def page_is_written(plan: ScanPlan, start: int, stop: int) -> bool:
    """Whether tasks ``start``..``stop`` are slices of task texts already written (so
    serving them costs a copy: a server need not hand them to a worker thread)."""
    if len(plan.deletes):
        return False
    return all(
        len(rows) < COLUMNS_FROM_ROWS // 8 or _HEADS.holds(plan, m)
        for m, rows in plan.pieces(start, stop)
    )


def scan_tasks_bytes(plan: ScanPlan, start: int, stop: int) -> bytes:
    """The ``ScanTasks`` object of tasks ``start``..``stop`` as UTF-8 JSON text."""
    return scan_tasks_wrapped(plan, start, stop, b"{", b"}")


def _text(value: str) -> Any:
    return pa.scalar(value, pa.string())


class _Rows:
    """Some rows of a manifest: columns cut by a slice when the rows are contiguous (as a
    plan's always are: compact copies are read in order), by ``take`` otherwise."""

    def __init__(self, m: CachedManifest, rows: Any) -> None:
        self.m = m
        self.rows = rows
        n = len(rows)
        first = rows[0].as_py() if n else 0
        self.first = first if n and rows[n - 1].as_py() == first + n - 1 else None

    def cut(self, array: Any) -> Any:
        if self.first is not None:
            return array.slice(self.first, len(self.rows))
        return pc.take(array, self.rows)

    def column(self, name: str) -> Any:
        return self.cut(self.m.column(name))


def _piece(plan: ScanPlan, m: CachedManifest, rows: Any, deletes: _DeleteFiles) -> Any:
    """The task texts (each followed by a comma) of rows ``rows`` of manifest ``m``: bytes,
    or an Arrow buffer of them (not copied until the page is joined)."""
    n = len(rows)
    if n == 0:
        return b""
    if n < COLUMNS_FROM_ROWS:
        return _piece_per_file(plan, m, rows, deletes)
    cut = _Rows(m, rows)
    if m.content != ManifestContent.DATA or pc.any(pc.not_equal(cut.column("content"), 0)).as_py():
        return _piece_per_file(plan, m, rows, deletes)
    closed = not len(plan.deletes)  # no delete references: the texts end the task
    head = _HEADS.get(plan, m, cut, closed)
    if closed:
        return _string_bytes(head)
    refs = _delete_refs(plan, m, cut, _LazyGroups(m, cut), deletes)
    if refs is None:
        joined = pc.binary_join_element_wise(head, _text("},"), "")
    else:
        joined = pc.binary_join_element_wise(
            head, refs, _text("},"), "", null_handling="replace", null_replacement=""
        )
    return _string_bytes(joined)


def _head(plan: ScanPlan, m: CachedManifest, cut: _Rows, closed: bool) -> Any:
    """Task texts up to the residual filter (and the task's end when ``closed``)."""
    spec = plan.specs[m.spec_id]
    json_type = spec.partition_type(plan.schema)
    groups = _LazyGroups(m, cut)
    text = _Fragments()
    text.add(f'{{"data-file":{{"spec-id":{m.spec_id},"content":"data","file-path":')
    text.add_string(cut.column("file_path"))
    text.add(',"file-format":')
    text.add(_by_value(cut.column("file_format"), lambda v: json.dumps(v)))
    text.add(',"partition":[')
    for pos, field in enumerate(json_type.fields):
        if pos:
            text.add(",")
        text.add(_partition_json(m, pos, cut, field.field_type, groups))
    text.add('],"file-size-in-bytes":')
    text.add(pc.cast(cut.column("file_size_in_bytes"), pa.string()))
    text.add(',"record-count":')
    text.add(pc.cast(cut.column("record_count"), pa.string()))
    text.add_optional(',"key-metadata":', _hex, cut.column("key_metadata"))
    text.add_optional(',"split-offsets":[', _int_lists, cut.column("split_offsets"), "]")
    text.add_optional(',"sort-order-id":', _numbers, cut.column("sort_order_id"))
    text.add_optional(',"first-row-id":', _numbers, cut.column("first_row_id"))
    if plan.stats_field_ids:
        for stats in _column_stats(plan, m, cut):
            text.add(stats)
    text.add("}")
    text.add(_residuals(plan, m, groups))
    if closed:
        text.add("},")
    return text.join()


class _Fragments:
    """The parts of one text per row, joined by one ``binary_join_element_wise``.

    Every part is a pass of that join, and every join made on the way (a prefix glued to its
    value) is a pass of its own plus a copy of its strings: so adjacent constant texts are
    merged into one part, and a column without nulls goes in bare, its prefix and suffix as
    constant parts. Only an optional field with some values missing is joined beforehand
    (its prefix must vanish where the value does: a null part is written as nothing).
    """

    def __init__(self) -> None:
        self.parts: list[Any] = []

    def add(self, part: str | Any | None) -> None:
        """A constant text, or a string array (null written as nothing); None adds nothing."""
        if part is None:
            return
        if isinstance(part, str) and self.parts and isinstance(self.parts[-1], str):
            self.parts[-1] += part
        else:
            self.parts.append(part)

    def add_string(self, array: Any) -> None:
        """Strings as JSON string literals (null stays null, then written as nothing)."""
        if _needs_escape(array):
            self.add(_json_strings(array))
        else:
            self.add('"')
            self.add(array)
            self.add('"')

    def add_optional(
        self, prefix: str, text: Callable[[Any], Any], values: Any, suffix: str = ""
    ) -> None:
        """``prefix`` + ``text(values)`` + ``suffix`` where a value is present, nothing where
        it is not."""
        if values.null_count == len(values):
            return
        if values.null_count == 0:
            self.add(prefix)
            self.add(text(values))
            self.add(suffix)
            return
        parts = [_text(prefix), text(values)] + ([_text(suffix)] if suffix else [])
        self.add(pc.binary_join_element_wise(*parts, ""))

    def join(self) -> Any:
        parts = [_text(p) if isinstance(p, str) else p for p in self.parts]
        return pc.binary_join_element_wise(*parts, "", null_handling="replace", null_replacement="")


class _HeadCache:
    """The task texts of the manifest a plan is being paged through, made once for the whole
    manifest and sliced per page: a kernel call costs the same for 1,000 rows as for 5,000,
    so writing a manifest's rows in one go and serving its pages from that is several times
    cheaper. Bounded by ``max_bytes`` (least recently used first) and dropped when its last
    page is served; plans and manifests are held weakly, so a dropped plan frees its entry.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, int], tuple[Any, Any, Any]] = OrderedDict()
        self._bytes = 0

    def get(self, plan: ScanPlan, m: CachedManifest, cut: _Rows, closed: bool) -> Any:
        start = cut.first
        kept = _kept_texts(plan, m, closed)
        if kept is not None:
            texts = m.derived(
                kept,
                lambda: _head(plan, m, _Rows(m, m.row_numbers()), closed),
                shared=_shared_name(kept),
            )
            if start is None:
                return pc.take(texts, cut.rows)
            return texts if len(cut.rows) == m.num_rows else texts.slice(start, len(cut.rows))
        if start is None or len(cut.rows) == m.num_rows:
            return _head(plan, m, cut, closed)
        key = (id(plan), id(m))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and (entry[0]() is not plan or entry[1]() is not m):
                self._drop(key)
                entry = None
        if entry is None:
            texts = _head(plan, m, _Rows(m, m.row_numbers()), closed)
            entry = (weakref.ref(plan), weakref.ref(m), texts)
            with self._lock:
                if key not in self._entries:
                    self._entries[key] = entry
                    self._bytes += int(texts.nbytes)
                    while self._bytes > self.max_bytes and self._entries:
                        self._drop(next(iter(self._entries)))
        texts = entry[2]
        if start + len(cut.rows) >= m.num_rows:
            with self._lock:
                self._drop(key)  # the manifest's last page
        return texts.slice(start, len(cut.rows))

    def holds(self, plan: ScanPlan, m: CachedManifest) -> bool:
        kept = _kept_texts(plan, m, not len(plan.deletes))
        if kept is not None and m.has_derived(kept):
            return True
        with self._lock:
            entry = self._entries.get((id(plan), id(m)))
        return entry is not None and entry[0]() is plan and entry[1]() is m

    def _drop(self, key: tuple[int, int]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= int(entry[2].nbytes)


def _kept_texts(plan: ScanPlan, m: CachedManifest, closed: bool) -> tuple[Any, ...] | None:
    """The key under which manifest ``m`` keeps the task texts of all its rows for plans like
    ``plan`` (:meth:`CachedManifest.derived`), or None if they are not kept.

    They are kept for plans without a row filter (full scans: the pages that cost most,
    a million files of them, and a dashboard's refresh asks for the same again); a text
    is then a function of the manifest's row and of what the key names: the types the
    partition values are written as, the stats fields asked for (with the types their
    bounds are written as), and whether delete references follow. Types rather than a
    schema id: two tables registered over the same files share the cached manifest. With
    a filter the residuals would be a part of the key, so those texts live only while a
    plan is paged (:class:`_HeadCache`).
    """
    if not isinstance(plan.row_filter, AlwaysTrue):
        return None
    partition = plan.specs[m.spec_id].partition_type(plan.schema)
    stats = tuple(
        (fid, None if (f := plan.schema.find_field(fid)) is None else (f.name, f.field_type))
        for fid in sorted(plan.stats_field_ids)
    )
    return ("task-texts", partition, stats, closed)


# The version of the task texts' form: texts kept in a disk store by an older writer are not
# served once this changes (bump it with any change to what :func:`_head` writes).
TEXTS_VERSION = 1


def _shared_name(kept: tuple[Any, ...]) -> str:
    """The name of kept texts in a disk store, the same in every process: a digest of what
    the key names (types print the same everywhere) and of the writer's version."""
    digest = hashlib.sha256(f"{TEXTS_VERSION}:{kept!r}".encode()).hexdigest()
    return f"scan-task-texts-{digest}"


HEAD_CACHE_MAX_BYTES = 32 << 20
_HEADS = _HeadCache(HEAD_CACHE_MAX_BYTES)


# Fewer rows than this are written per file: the column writer's thirty-odd kernel calls
# cost a few milliseconds whatever the row count, which is most of a selective plan.
COLUMNS_FROM_ROWS = 48


def _piece_per_file(plan: ScanPlan, m: CachedManifest, rows: Any, deletes: _DeleteFiles) -> bytes:
    """Rows written per file, as the reference does: for a few rows (cheaper than the
    kernels) and for rows the column writer does not handle (a delete manifest's)."""
    with_metrics = bool(plan.stats_field_ids) or plan.deletes.has_equality_deletes()
    decoded = m.rows(rows, with_metrics=with_metrics)
    residual = plan.residual_evaluator(m.spec_id)
    out = []
    for f, seq in zip(decoded.data_files, decoded.data_sequence_numbers):
        entry: dict[str, Any] = {"data-file": content_file_json(f, plan, plan.stats_field_ids)}
        text = json.dumps(entry, separators=(",", ":"))[:-1]
        member = residual_member(plan, residual.residual_for(f.partition))
        if member is not None:
            text += member
        refs = deletes.refs(plan.deletes.for_data_file(f, seq))
        if refs:
            text += ',"delete-file-references":' + json.dumps(refs, separators=(",", ":"))
        out.append(text + "},")
    return "".join(out).encode("utf-8")


def _string_bytes(array: Any) -> Any:
    """The concatenated UTF-8 bytes of a string array without nulls, as a bytes-like Arrow
    buffer sharing the array's memory (no copy)."""
    _, offsets_buffer, data = array.buffers()
    if data is None or len(array) == 0:
        return b""
    offsets = pa.Array.from_buffers(
        pa.int32(), len(array) + 1, [None, offsets_buffer], 0, array.offset
    )
    first, last = offsets[0].as_py(), offsets[len(array)].as_py()
    return data.slice(first, last - first)


def _needs_escape(array: Any) -> bool:
    """Whether any string of ``array`` holds a character JSON escapes: one look at the bytes
    of all its strings (a byte below 0x20, a quote or a backslash; a UTF-8 sequence's bytes
    are all 0x80 or above, so no multi-byte character matches by accident)."""
    if not pa.types.is_string(array.type):
        return bool(pc.any(pc.match_substring_regex(array, _NEEDS_ESCAPE)).as_py())
    data = _string_bytes(array)
    if not len(data):
        return False
    raw = np.frombuffer(data, dtype=np.uint8)
    return bool((raw < 0x20).any() or (raw == 0x22).any() or (raw == 0x5C).any())


def _json_strings(array: Any) -> Any:
    """Strings as JSON string literals (null stays null)."""
    needs = pc.match_substring_regex(array, _NEEDS_ESCAPE)
    quoted = pc.binary_join_element_wise(_text('"'), array, _text('"'), "")
    if not pc.any(needs).as_py():
        return quoted
    values = array.to_pylist()
    escaped = [
        json.dumps(v, ensure_ascii=False) if v is not None and _NEEDS_ESCAPE_RE.search(v) else None
        for v in values
    ]
    return pc.if_else(pc.fill_null(needs, False), pa.array(escaped, pa.string()), quoted)


def _by_value(array: Any, text: Callable[[Any], str]) -> Any:
    """``text(value)`` of each value, computed once per distinct value (null stays null)."""
    encoded = array if pa.types.is_dictionary(array.type) else array.dictionary_encode()
    texts = pa.array([text(v) for v in encoded.dictionary.to_pylist()], pa.string())
    return pc.take(texts, encoded.indices)


def _numbers(array: Any) -> Any:
    return pc.cast(array, pa.string())


def _hex(array: Any) -> Any:
    if array.null_count == len(array):
        return array.cast(pa.string())
    return pa.array(
        [None if v is None else json.dumps(v.hex().upper()) for v in array.to_pylist()],
        pa.string(),
    )


def _int_lists(array: Any) -> Any:
    """``list<int>`` values as the insides of JSON arrays (null stays null)."""
    return pc.binary_join(array.cast(pa.list_(pa.string())), ",")


# ---------------------------------------------------------------------------------------------
# Column stats (for plans that ask for them with ``stats-fields``)
# ---------------------------------------------------------------------------------------------

_COUNT_STATS = (
    ("column-sizes", "column_sizes"),
    ("value-counts", "value_counts"),
    ("null-value-counts", "null_value_counts"),
    ("nan-value-counts", "nan_value_counts"),
)
_BOUND_STATS = (("lower-bounds", "lower_bounds"), ("upper-bounds", "upper_bounds"))


def _column_stats(plan: ScanPlan, m: CachedManifest, cut: _Rows) -> list[Any]:
    """``,"value-counts":{"keys":[…],"values":[…]}`` and the other stats maps, one string
    array each (null where a row has none of the asked columns: the reference omits an empty
    map). Counts are cast by Arrow; a bound is converted from its stored bytes by the
    reference's own functions, once per distinct value. A column no longer in the schema, or
    not primitive, has no typed bound, so bounds list only the others (as the reference)."""
    ids = sorted(plan.stats_field_ids)
    out = []
    for key, column in _COUNT_STATS:
        counts = [pc.cast(cut.cut(m.counts(column, fid)), pa.string()) for fid in ids]
        out.append(_stats_map(key, ids, counts))
    typed: list[tuple[int, PrimitiveType, str]] = []
    for fid in ids:
        field = plan.schema.find_field(fid)
        if field is not None and isinstance(field.field_type, PrimitiveType):
            typed.append((fid, field.field_type, field.name))
    for key, column in _BOUND_STATS:
        bounds = [
            _bound_texts(t, cut.cut(m.raw_bounds(column, fid)), cut, name, column[:5])
            for fid, t, name in typed
        ]
        out.append(_stats_map(key, [fid for fid, _, _ in typed], bounds))
    return [stats for stats in out if stats is not None]


def _bound_texts(t: PrimitiveType, raw: Any, cut: _Rows, name: str, which: str) -> Any:
    """Stored bounds as JSON texts (null stays null): integers decoded and cast by Arrow,
    other types by the reference's conversion once per distinct stored value."""
    if isinstance(t, IntegerType | LongType):
        paths = cut.column("file_path")
        decoded = decode_bounds(t, raw, lambda row: str(paths[row]), name, which)
        return pc.cast(decoded, pa.string())
    return _by_value(raw, partial(_bound_json, t))


def _bound_json(t: PrimitiveType, raw: bytes) -> str:
    return json.dumps(value_json(t, from_bytes(t, raw)))


def _stats_map(key: str, ids: list[int], texts: list[Any]) -> Any | None:
    """``,"<key>":{"keys":[ids present],"values":[their texts]}`` per row, from one text
    array per field id (null where the row has no value for it); null where a row has none."""
    pairs = [(fid, t) for fid, t in zip(ids, texts, strict=True) if t.null_count < len(t)]
    if not pairs:
        return None
    if len(pairs) == 1:
        fid, only = pairs[0]
        return pc.binary_join_element_wise(
            _text(f',"{key}":{{"keys":[{fid}],"values":['), only, _text("]}"), ""
        )
    absent = pa.scalar(None, pa.string())
    keys = pc.binary_join_element_wise(
        *[pc.if_else(pc.is_valid(t), _text(str(fid)), absent) for fid, t in pairs],
        ",",
        null_handling="skip",
    )
    values = pc.binary_join_element_wise(*[t for _, t in pairs], ",", null_handling="skip")
    entry = pc.binary_join_element_wise(
        _text(f',"{key}":{{"keys":['), keys, _text('],"values":['), values, _text("]}"), ""
    )
    present = pc.is_valid(pairs[0][1])
    for _, t in pairs[1:]:
        present = pc.or_(present, pc.is_valid(t))
    return pc.if_else(present, entry, absent)


# ---------------------------------------------------------------------------------------------
# Partitions: values, residuals, deletes
# ---------------------------------------------------------------------------------------------


class _PartitionGroups:
    """The distinct partition tuples of some rows, and each row's group (an int64 array).

    Each partition column is dictionary-encoded (Arrow tells -0.0 from 0.0 and keeps NaN
    one value, as the spec's partition equality does); the per-field indices pack into one
    key per row, whose distinct values are the groups.
    """

    def __init__(self, tuples: list[tuple[Any, ...]], index: Any) -> None:
        self.tuples = tuples
        self.index = index

    @classmethod
    def of(cls, m: CachedManifest, cut: _Rows) -> _PartitionGroups:
        fields = m.partition_type.fields
        rows = cut.rows
        n = len(rows)
        if not fields:
            return cls([()], pa.repeat(pa.scalar(0, pa.int64()), n))
        columns = [m.partition_column(pos) for pos in range(len(fields))]
        encoded = []
        stride = 1
        key = None
        for f, column in zip(fields, columns):
            if column is None:
                return cls._per_row(m, rows)
            enc = cut.cut(column).dictionary_encode()
            size = len(enc.dictionary) + 1  # the last index is null
            indices = pc.fill_null(enc.indices.cast(pa.int64()), size - 1)
            part = pc.multiply(indices, stride) if stride > 1 else indices
            key = part if key is None else pc.add(key, part)
            encoded.append((arrow_to_values(f.field_type, enc.dictionary), size, stride))
            stride *= size
            if stride > _MAX_KEY:
                return cls._per_row(m, rows)
        distinct = pc.unique(key)
        index = pc.index_in(key, value_set=distinct)
        tuples = []
        for k in distinct.to_pylist():
            values = []
            for dictionary, size, step in encoded:
                i = (k // step) % size
                values.append(None if i == size - 1 else dictionary[i])
            tuples.append(tuple(values))
        return cls(tuples, index.cast(pa.int64()))

    @classmethod
    def _per_row(cls, m: CachedManifest, rows: Any) -> _PartitionGroups:
        """Groups from Python tuples (partition values Arrow does not hold, many fields)."""
        from icefloe.deletes.index import partition_key

        all_tuples = m.partition_tuples()
        seen: dict[tuple[Any, ...], int] = {}
        tuples: list[tuple[Any, ...]] = []
        index = []
        for i in rows.to_pylist():
            t = all_tuples[i]
            k = partition_key(t)
            g = seen.get(k)
            if g is None:
                g = seen[k] = len(tuples)
                tuples.append(t)
            index.append(g)
        return cls(tuples, pa.array(index, pa.int64()))

    def spread(self, texts: list[str | None]) -> Any:
        """One text per group as one per row."""
        return pc.take(pa.array(texts, pa.string()), self.index)


class _LazyGroups:
    """:class:`_PartitionGroups` computed on first use (a full scan without deletes needs
    none: its residual is the request's filter everywhere)."""

    def __init__(self, m: CachedManifest, cut: _Rows) -> None:
        self.m = m
        self.cut = cut
        self._groups: _PartitionGroups | None = None

    def get(self) -> _PartitionGroups:
        if self._groups is None:
            self._groups = _PartitionGroups.of(self.m, self.cut)
        return self._groups


def _partition_json(
    m: CachedManifest, pos: int, cut: _Rows, t: IcebergType, groups: _LazyGroups
) -> Any:
    column = m.partition_column(pos)
    if column is None:
        g = groups.get()
        return g.spread([json.dumps(value_json(t, p[pos])) for p in g.tuples])
    writer_type = m.partition_type.fields[pos].field_type
    encoded = cut.cut(column).dictionary_encode()
    values = arrow_to_values(writer_type, encoded.dictionary)
    texts = pa.array([json.dumps(value_json(t, v)) for v in values], pa.string())
    return pc.fill_null(pc.take(texts, encoded.indices), "null")


def _residuals(plan: ScanPlan, m: CachedManifest, lazy: _LazyGroups) -> Any | None:
    """``,"residual-filter":…`` per row where the residual is not the request's filter."""
    if isinstance(plan.row_filter, AlwaysTrue):
        return None  # every residual is "true", the request's filter
    evaluator = plan.residual_evaluator(m.spec_id)
    groups = lazy.get()
    texts = [residual_member(plan, evaluator.residual_for(t)) for t in groups.tuples]
    if all(t is None for t in texts):
        return None
    return groups.spread(texts)


# Each row's delete files are listed as DeleteFileIndex.for_data_file lists them: by kind in
# this order, each kind's files in the index's lookup order (a row has one bucket per kind).
_DV, _BY_PATH, _BY_PARTITION, _EQUALITY = range(4)
_KIND = 1 << 32  # a hit's rank: kind * _KIND + its place in the bucket


class _Hits:
    """(row, rank, delete file) triples: the delete files chosen for some rows."""

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self.ranks: list[Any] = []
        self.files: list[DataFile] = []

    def add(self, rows: Any, rank: int, f: DataFile) -> None:
        self.rows.append(rows)
        self.ranks.append(np.full(len(rows), rank, dtype=np.int64))
        self.files.extend([f] * len(rows))


def _delete_refs(
    plan: ScanPlan,
    m: CachedManifest,
    cut: _Rows,
    lazy: _LazyGroups,
    deletes: _DeleteFiles,
) -> Any | None:
    """``,"delete-file-references":[…]`` per row that has deletes to apply.

    The index's rules, applied to all rows at once: deletes naming a path (deletion vectors,
    path-scoped position deletes) are looked up for the rows whose path is named; position
    deletes scoped to a partition are tested per (partition, delete) against the sequence
    numbers and paths of that partition's rows with numpy and Arrow; only the rows an
    equality delete may apply to (by sequence number or partition) are decoded, for the
    column metrics that can rule it out.
    """
    index = plan.deletes
    if not len(index):
        return None
    n = len(cut.rows)
    seqs = pc.fill_null(cut.column("data_sequence_number"), 0).to_numpy(zero_copy_only=False)
    paths = cut.column("file_path")
    hits = _Hits()
    vectored = np.zeros(n, dtype=bool)  # rows an applying deletion vector covers
    named_paths = index.referenced_paths()
    if named_paths:
        named = pc.fill_null(pc.is_in(paths, value_set=pa.array(sorted(named_paths))), False)
        rows = pc.indices_nonzero(named).to_numpy()
        if len(rows):
            groups = lazy.get()
            group_of = groups.index.to_numpy()
            for i in rows.tolist():
                (dv_seqs, dvs), (bp_seqs, by_path) = index.path_deletes(paths[i].as_py())
                part = groups.tuples[group_of[i]]
                row = np.array([i], dtype=np.int64)
                for j, (d_seq, d) in enumerate(zip(dv_seqs, dvs, strict=True)):
                    if seqs[i] <= d_seq and same_partition(d, m.spec_id, part):
                        hits.add(row, _DV * _KIND + j, d)
                        vectored[i] = True
                if vectored[i]:
                    continue
                for j, (d_seq, d) in enumerate(zip(bp_seqs, by_path, strict=True)):
                    if seqs[i] <= d_seq and same_partition(d, m.spec_id, part):
                        hits.add(row, _BY_PATH * _KIND + j, d)
    if index.has_partition_position_deletes():
        _partition_position_hits(index, m, lazy.get(), seqs, paths, vectored, hits)
    _equality_hits(plan, m, cut, lazy, seqs, hits)
    if not hits.rows:
        return None
    rows_all = np.concatenate(hits.rows)
    order = np.lexsort((np.concatenate(hits.ranks), rows_all))
    refs = deletes.refs([hits.files[k] for k in order])  # numbered by first appearance
    rows_sorted = rows_all[order]
    with_refs, starts = np.unique(rows_sorted, return_index=True)
    offsets = pa.array(np.append(starts, len(rows_sorted)).astype(np.int32))
    lists = pa.ListArray.from_arrays(offsets, pa.array(refs, pa.int64()).cast(pa.string()))
    texts = pc.binary_join_element_wise(
        _text(',"delete-file-references":['), pc.binary_join(lists, ","), _text("]"), ""
    )
    where = np.full(n, -1, dtype=np.int64)
    where[with_refs] = np.arange(len(with_refs))
    return pc.take(texts, pa.array(where, mask=where < 0))


def _partition_position_hits(
    index: Any,
    m: CachedManifest,
    groups: _PartitionGroups,
    seqs: Any,
    paths: Any,
    vectored: Any,
    hits: _Hits,
) -> None:
    """Position deletes scoped to a partition: each applies to the rows of its partition with
    a sequence number ``<=`` its own whose path lies within its ``file_path`` bounds, unless
    a deletion vector covers the row."""
    group_of = groups.index.to_numpy()
    binary_paths: Any = None
    for g, part in enumerate(groups.tuples):
        d_seqs, files = index.partition_position_deletes(m.spec_id, part)
        if not files:
            continue
        in_group = np.nonzero((group_of == g) & ~vectored)[0]
        for j, (d_seq, d) in enumerate(zip(d_seqs, files, strict=True)):
            rows = in_group[seqs[in_group] <= d_seq]
            lower, upper = path_bounds(d)
            if len(rows) and (lower is not None or upper is not None):
                if binary_paths is None:
                    binary_paths = paths.cast(pa.binary())
                candidates = binary_paths.take(pa.array(rows))
                within = pa.repeat(pa.scalar(True), len(rows))
                if lower is not None:
                    within = pc.and_(within, pc.greater_equal(candidates, pa.scalar(lower)))
                if upper is not None:
                    within = pc.and_(within, pc.less_equal(candidates, pa.scalar(upper)))
                rows = rows[pc.fill_null(within, False).to_numpy(zero_copy_only=False)]
            if len(rows):
                hits.add(rows, _BY_PARTITION * _KIND + j, d)


def _equality_hits(
    plan: ScanPlan, m: CachedManifest, cut: _Rows, lazy: _LazyGroups, seqs: Any, hits: _Hits
) -> None:
    """Equality deletes for the rows one may apply to: below a global equality delete's
    sequence number, or in a partition with equality deletes. Those rows are decoded (with
    metrics: an equality delete is ruled out by the data file's column bounds and counts)."""
    index = plan.deletes
    if not index.has_equality_deletes():
        return
    candidates = np.zeros(len(seqs), dtype=bool)
    newest_global = index.max_global_sequence()
    if newest_global is not None:
        candidates |= seqs < newest_global
    groups = lazy.get()
    scoped = [index.scopes_equality(m.spec_id, t) for t in groups.tuples]
    if any(scoped):
        candidates |= np.array(scoped, dtype=bool)[groups.index.to_numpy()]
    rows = np.nonzero(candidates)[0]
    if not len(rows):
        return
    decoded = m.rows(pc.take(cut.rows, pa.array(rows)), with_metrics=True)
    for i, f, seq in zip(
        rows.tolist(), decoded.data_files, decoded.data_sequence_numbers, strict=True
    ):
        row = np.array([i], dtype=np.int64)
        for k, d in enumerate(index.equality_deletes_for(f, seq)):
            hits.add(row, _EQUALITY * _KIND + k, d)


__all__ = [
    "content_file_json",
    "page_is_written",
    "same_filter",
    "scan_tasks_bytes",
    "scan_tasks_json",
    "scan_tasks_wrapped",
]
