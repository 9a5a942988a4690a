"""Apache Iceberg Java 1.10.2 (Spark 3.5) as a long-lived subprocess, for interop tests.

The reference implementation runs in its own venv (``.venv-java``, made by
deploy/setup_java_interop.sh through ``make setup``) because the project's Spark is 4.x.
:class:`JavaIceberg` starts :mod:`java_iceberg_driver` there once and sends it SQL over a
pipe; tests share one instance per session (the ``java_iceberg`` fixture), so the JVM and
Spark start once.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
JAVA_VENV = Path(os.environ.get("ICEFLOE_JAVA_VENV", ROOT / ".venv-java"))
DRIVER = Path(__file__).resolve().parent / "java_iceberg_driver.py"


class JavaIcebergError(RuntimeError):
    """Java refused a statement (its message is the exception's), or the driver died."""


class JavaIceberg:
    """One Spark 3.5 session with Iceberg Java 1.10.2; :meth:`sql` runs one statement."""

    def __init__(self) -> None:
        python = JAVA_VENV / "bin" / "python"
        jars = JAVA_VENV / "iceberg-jars"
        if not python.exists() or not any(jars.glob("iceberg-spark-runtime-*.jar")):
            raise JavaIcebergError(
                f"the Java interop environment is missing ({JAVA_VENV}); run `make setup` "
                "(deploy/setup_java_interop.sh) first"
            )
        env = dict(os.environ)
        env["ICEFLOE_ICEBERG_JARS"] = str(jars)
        env["PYSPARK_PYTHON"] = str(python)
        env["PYSPARK_DRIVER_PYTHON"] = str(python)
        java17 = sorted(glob.glob("/usr/lib/jvm/java-17-openjdk-*"))
        if java17:  # Spark 3.5 runs on Java 8/11/17 only
            env["JAVA_HOME"] = java17[0]
        for key in ("SPARK_HOME", "PYTHONPATH", "VIRTUAL_ENV"):
            env.pop(key, None)
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the process
            prefix="icefloe-java-iceberg-", suffix=".log", delete=False
        )
        self.log_path = self._log.name
        self._proc = subprocess.Popen(
            [str(python), str(DRIVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
            bufsize=1,
        )
        self._send({"op": "ping"})

    def _log_tail(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def _send(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(json.dumps(command) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise JavaIcebergError(f"the Java driver exited:\n{self._log_tail()}") from None
        line = self._proc.stdout.readline()
        if not line:
            raise JavaIcebergError(f"the Java driver exited:\n{self._log_tail()}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise JavaIcebergError(str(answer.get("error")))
        return answer

    def sql(self, warehouse: str | Path, statement: str) -> list[dict[str, Any]]:
        """Run ``statement`` (``{cat}`` is the HadoopCatalog of ``warehouse``); rows as dicts."""
        answer = self._send({"op": "sql", "warehouse": str(warehouse), "sql": statement})
        columns = answer["columns"]
        return [dict(zip(columns, row)) for row in answer["rows"]]

    def register_catalog(self, name: str, properties: dict[str, str]) -> None:
        """Register Spark catalog ``name`` (an Iceberg ``SparkCatalog``) with ``properties``,
        e.g. ``{"type": "rest", "uri": ..., "token": ...}``; SQL then names it directly.
        A name is registered once per session (Spark keeps its first instance)."""
        self._send({"op": "catalog", "name": name, "properties": properties})

    def close(self) -> None:
        """Stop the driver: end of input lets Spark stop cleanly; kill it if it hangs."""
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.close()
            except OSError:
                pass
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        os.unlink(self.log_path)
