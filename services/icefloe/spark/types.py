"""Types between Iceberg and Spark, and the Arrow bridge between DataFrames and tasks.

Types map to Spark as Iceberg's Spark integration does, except where Spark has no
equivalent: ``uuid`` reads as its string form, ``fixed`` as binary, ``time`` as a long of
microseconds since midnight and ``timestamp_ns``/``timestamptz_ns`` as longs of nanoseconds
since the epoch (never truncated silently); writes accept those forms back.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import types as st

from icefloe.errors import (
    SchemaEvolutionError,
    ValidationError,
)
from icefloe.expressions import (
    BooleanExpression,
)
from icefloe.expressions.json_form import expression_to_json, parse_filter_text
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    GeographyType,
    GeometryType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)

FilterArg = BooleanExpression | Mapping[str, Any] | bool | str | None


# ---------------------------------------------------------------------------------------
# Type mapping between Iceberg and Spark
# ---------------------------------------------------------------------------------------


def iceberg_to_spark_type(t: IcebergType) -> st.DataType:
    """The Spark type a column of Iceberg type ``t`` reads as (see the module docstring)."""
    simple: dict[type[IcebergType], st.DataType] = {
        BooleanType: st.BooleanType(),
        IntegerType: st.IntegerType(),
        LongType: st.LongType(),
        FloatType: st.FloatType(),
        DoubleType: st.DoubleType(),
        DateType: st.DateType(),
        TimeType: st.LongType(),
        TimestampType: st.TimestampNTZType(),
        TimestamptzType: st.TimestampType(),
        TimestampNanoType: st.LongType(),
        TimestamptzNanoType: st.LongType(),
        StringType: st.StringType(),
        UUIDType: st.StringType(),
        BinaryType: st.BinaryType(),
        FixedType: st.BinaryType(),
        GeometryType: st.BinaryType(),
        GeographyType: st.BinaryType(),
        UnknownType: st.NullType(),
    }
    found = simple.get(type(t))
    if found is not None:
        return found
    if isinstance(t, DecimalType):
        return st.DecimalType(t.precision, t.scale)
    if isinstance(t, StructType):
        return st.StructType(
            [
                st.StructField(f.name, iceberg_to_spark_type(f.field_type), not f.required)
                for f in t.fields
            ]
        )
    if isinstance(t, ListType):
        return st.ArrayType(iceberg_to_spark_type(t.element_type), not t.element_required)
    if isinstance(t, MapType):
        return st.MapType(
            iceberg_to_spark_type(t.key_type),
            iceberg_to_spark_type(t.value_type),
            not t.value_required,
        )
    raise ValidationError(f"Iceberg type {t} cannot be read into Spark by icefloe")


def spark_schema(schema: Schema) -> st.StructType:
    """The Spark schema of a table schema."""
    struct = iceberg_to_spark_type(schema.struct)
    assert isinstance(struct, st.StructType)
    return struct


def spark_to_iceberg_type(
    dt: st.DataType, next_id: Callable[[], int], path: str, format_version: int = 2
) -> IcebergType:
    """The Iceberg type to store a new Spark column of type ``dt`` (fresh field ids)."""
    if isinstance(dt, st.BooleanType):
        return BooleanType()
    if isinstance(dt, st.ByteType | st.ShortType | st.IntegerType):
        return IntegerType()
    if isinstance(dt, st.LongType):
        return LongType()
    if isinstance(dt, st.FloatType):
        return FloatType()
    if isinstance(dt, st.DoubleType):
        return DoubleType()
    if isinstance(dt, st.DecimalType):
        return DecimalType(dt.precision, dt.scale)
    if isinstance(dt, st.StringType | st.VarcharType | st.CharType):
        return StringType()
    if isinstance(dt, st.BinaryType):
        return BinaryType()
    if isinstance(dt, st.DateType):
        return DateType()
    if isinstance(dt, st.TimestampType):
        return TimestamptzType()
    if isinstance(dt, st.TimestampNTZType):
        return TimestampType()
    if isinstance(dt, st.TimeType):
        return TimeType()
    if isinstance(dt, st.NullType) and format_version >= 3:
        return UnknownType()
    if isinstance(dt, st.StructType):
        return StructType(
            *(
                NestedField(
                    next_id(),
                    f.name,
                    spark_to_iceberg_type(f.dataType, next_id, f"{path}.{f.name}", format_version),
                    required=False,
                )
                for f in dt.fields
            )
        )
    if isinstance(dt, st.ArrayType):
        element_id = next_id()
        return ListType(
            element_id,
            spark_to_iceberg_type(dt.elementType, next_id, f"{path}.element", format_version),
            element_required=not dt.containsNull,
        )
    if isinstance(dt, st.MapType):
        key_id, value_id = next_id(), next_id()
        return MapType(
            key_id,
            spark_to_iceberg_type(dt.keyType, next_id, f"{path}.key", format_version),
            value_id,
            spark_to_iceberg_type(dt.valueType, next_id, f"{path}.value", format_version),
            value_required=not dt.valueContainsNull,
        )
    raise SchemaEvolutionError(
        f"column {path!r} has Spark type {dt.simpleString()}, which icefloe cannot add to an "
        f"Iceberg v{format_version} table"
    )


def arrow_schema_of(df_schema: st.StructType, timezone: str) -> pa.Schema:
    """The Arrow schema Spark hands a DataFrame's rows to Python in (a ValidationError
    naming the column when Spark cannot)."""
    from pyspark.errors import PySparkException
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(df_schema, timezone=timezone)
    except (PySparkException, TypeError, ValueError) as e:
        raise ValidationError(
            f"the DataFrame ({df_schema.simpleString():.200}) has a column Spark cannot hand "
            f"to Python as Arrow: {e}"
        ) from None


def map_in_arrow(df: DataFrame, func: Callable[..., Any], schema: str | st.StructType) -> DataFrame:
    """``df.mapInArrow`` without PySpark's pandas requirement (Arrow is all it uses).

    PySpark builds the UDF behind ``mapInArrow`` with ``pandas_udf``, which insists on
    pandas being installed although Arrow batches never touch it; without pandas the same
    UDF is built directly.
    """
    jdf = getattr(df, "_jdf", None)
    if importlib.util.find_spec("pandas") is None and jdf is not None:
        from pyspark.sql.pandas import functions as pandas_functions
        from pyspark.util import PythonEvalType

        udf = pandas_functions.vectorized_udf(  # type: ignore[attr-defined]
            func,
            returnType=schema,
            functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF,
            kind="pandas",
        )
        column = udf(*[df[c] for c in df.columns])
        return DataFrame(jdf.mapInArrow(column._jc, False, None), df.sparkSession)
    return df.mapInArrow(func, schema)


def filter_to_json(expr: FilterArg) -> Any:
    """A filter argument (an expression, its JSON text or parsed JSON) as expression JSON."""
    if expr is None:
        return None
    if isinstance(expr, BooleanExpression):
        return expression_to_json(expr)
    if isinstance(expr, str):  # "a >= 1 and b = 'x'", or expression JSON starting with "{"
        return expression_to_json(parse_filter_text(expr))
    return expr if isinstance(expr, bool) else dict(expr)
