"""The Java side of the interop tests: Apache Iceberg Java 1.10.2 in a PySpark 3.5 session.

Runs in ``.venv-java`` (see deploy/setup_java_interop.sh), never in the project's venv: it
imports nothing of icefloe. It reads one JSON command per line on stdin and answers each
with one JSON line on the stdout it was started with; everything else the process prints
(Spark's and the JVM's logs) goes to stderr, so a log line can never be taken for an answer.

Commands::

    {"op": "ping"}
    {"op": "sql", "warehouse": "/abs/dir", "sql": "SELECT * FROM {cat}.db.t"}
    {"op": "catalog", "name": "ice", "properties": {"type": "rest", "uri": "http://..."}}

``{cat}`` in the SQL names a HadoopCatalog over ``warehouse`` (one Spark catalog per
warehouse, registered on first use). ``catalog`` (re)registers a named Iceberg catalog with
the given properties (e.g. Iceberg's REST client against icefloe), which SQL then names
directly. Spark keeps the first instance of a name for the session, so a name is registered
once (a second registration is refused): use a new name for a new server. An answer is ``{"ok": true, "columns": [...], "rows":
[[...], ...]}`` with values made JSON-safe (see :func:`_json_value`), or ``{"ok": false,
"error": "..."}`` when Spark or Iceberg refused the statement; the session stays usable.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import glob
import json
import os
import sys
from typing import Any


def _json_value(v: Any) -> Any:
    """Values in a form both sides agree on: ISO text for time, str for decimals, base64."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    if isinstance(v, datetime.datetime):
        return v.isoformat()
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if hasattr(v, "asDict"):
        return {k: _json_value(x) for k, x in v.asDict().items()}
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    return str(v)


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)  # Spark and the JVM write to fd 1 too: send them to stderr
    sys.stdout = sys.stderr
    jars_dir = os.environ["ICEFLOE_ICEBERG_JARS"]
    jars = sorted(glob.glob(os.path.join(jars_dir, "*.jar")))
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[1]")
        .appName("icefloe-java-interop")
        .config("spark.jars", ",".join(jars))
        .config(
            "spark.sql.extensions",
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    catalogs: dict[str, str] = {}
    named: set[str] = set()

    def catalog_for(warehouse: str) -> str:
        name = catalogs.get(warehouse)
        if name is None:
            name = f"h{len(catalogs)}"
            prefix = f"spark.sql.catalog.{name}"
            spark.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
            spark.conf.set(f"{prefix}.type", "hadoop")
            spark.conf.set(f"{prefix}.warehouse", warehouse)
            spark.conf.set(f"{prefix}.cache-enabled", "false")
            catalogs[warehouse] = name
        return name

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            command = json.loads(line)
            op = command.get("op")
            if op == "ping":
                answer: dict[str, Any] = {"ok": True, "columns": [], "rows": []}
            elif op == "catalog":
                name = command["name"]
                if not name.isidentifier() or name.startswith("h") or name in named:
                    raise ValueError(
                        f"catalog name {name!r}: a new identifier not starting with 'h'"
                    )
                named.add(name)
                prefix = f"spark.sql.catalog.{name}"
                spark.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
                for key, value in command["properties"].items():
                    spark.conf.set(f"{prefix}.{key}", str(value))
                answer = {"ok": True, "columns": [], "rows": []}
            elif op == "sql":
                text = command["sql"]
                if "{cat}" in text:
                    text = text.replace("{cat}", catalog_for(command["warehouse"]))
                frame = spark.sql(text)
                rows = frame.collect()
                answer = {
                    "ok": True,
                    "columns": list(frame.columns),
                    "rows": [[_json_value(v) for v in row] for row in rows],
                }
            else:
                answer = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as e:  # reported to the test, which decides what it means
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        answers.write(json.dumps(answer) + "\n")
    spark.stop()


if __name__ == "__main__":
    main()
