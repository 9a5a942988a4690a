"""Fixtures for the Spark tests: one Spark session, one coordinator, one scan planner.

The Spark session is shared by the whole run, since the JVM takes many seconds to start:
``local[2,2]`` (two threads; ``,2`` allows a second attempt per task, which the
failed-attempt test needs). The coordinator (in a thread of its own, against the session's
tansu broker and redis) and the scan planner live for one test module: their Kafka
consumers run in the background, and must not outlive the modules that need them. Tests
keep out of each other's way by using their own tables.

The planner is the real service (:mod:`icefloe.planner.app`), paging its answers two tasks at a
time so that reads follow plan tasks, and following the coordinator's results topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import pytest
import task_faults_daemon
from coordinating import coordinator_config

from icefloe.catalog.uri import load_catalog
from icefloe.coordinator.config import CoordinatorConfig
from icefloe.coordinator.service import Coordinator
from icefloe.manifests.reader import ManifestReader
from icefloe.planner.app import PlannerService
from icefloe.planner.config import PlannerConfig
from icefloe.spark.config import SparkConfig
from icefloe.spec.datafile import DataFile
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.table.catalog import Catalog, Table
from servers import S3Endpoint

T = TypeVar("T")
START_TIMEOUT_S = 120.0


class LoopThread:
    """An event loop in a daemon thread, for async helpers called from sync Spark tests."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 300.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        if not self.thread.is_alive():
            self.loop.close()


# -- Spark ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session's Spark: local[2,2], no UI, two shuffle partitions, UTC."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # The Python workers come from the tests' daemon, which lets a test fail task attempts.
    os.environ["PYTHONPATH"] = task_faults_daemon.workers_path(os.environ.get("PYTHONPATH"))
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("icefloe-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config(map=task_faults_daemon.spark_conf())
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        import icefloe.spark

        icefloe.spark.shutdown()
        session.stop()


# -- the coordinator -------------------------------------------------------------------------


class CoordinatorThread:
    """A coordinator running on its own event loop in a daemon thread."""

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.coordinator: Coordinator | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="icefloe-coordinator", daemon=True)

    def _main(self) -> None:
        async def run() -> None:
            self.loop = asyncio.get_running_loop()
            self.coordinator = Coordinator(self.config)
            await self.coordinator.run()

        try:
            asyncio.run(run())
        except BaseException as e:  # reported by start()/stop()
            self.error = e

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.coordinator is None or not self.coordinator.ready:
            if self.error is not None or not self.thread.is_alive():
                raise RuntimeError(f"the coordinator failed to start: {self.error!r}")
            if time.monotonic() > deadline:
                raise RuntimeError("the coordinator did not join its consumer group in time")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.loop is not None and self.coordinator is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.coordinator.request_stop)
        self.thread.join(60)


# -- the planner ---------------------------------------------------------------------------------


class PlannerThread:
    """The planner service on its own event loop; its results consumer keeps it current."""

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self.thread = LoopThread("icefloe-planner")
        self.service: PlannerService | None = None
        self.url = ""

    def start(self) -> None:
        async def start() -> str:
            self.service = PlannerService(self.config)
            await self.service.start()
            return self.service.url

        self.url = self.thread.run(start())

    def stop(self) -> None:
        async def stop() -> None:
            if self.service is not None:
                await self.service.stop()
                await self.service.catalog.close()

        self.thread.run(stop())
        self.thread.stop()


# -- the stack ---------------------------------------------------------------------------------


@dataclass
class SparkStack:
    """One catalog, coordinator and planner for all Spark tests, plus helpers."""

    catalog_uri: str
    warehouse: Path
    config: SparkConfig
    planner: PlannerThread
    helper: LoopThread
    catalog: Catalog
    namespaces: set[str] = field(default_factory=set)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.helper.run(coro)

    def create_table(
        self,
        schema: Schema,
        spec: PartitionSpec | None = None,
        properties: Mapping[str, str] | None = None,
        format_version: int = 2,
        namespace: str = "spark",
    ) -> str:
        """A new table with a unique name; returns ``namespace.name``."""
        name = f"{namespace}.t_{uuid.uuid4().hex[:10]}"

        async def create() -> None:
            if namespace not in self.namespaces:
                if not await self.catalog.namespace_exists(namespace):
                    await self.catalog.create_namespace(namespace)
                self.namespaces.add(namespace)
            await self.catalog.create_table(
                name, schema, spec, properties=properties, format_version=format_version
            )

        self.run(create())
        return name

    def load(self, name: str) -> Table:
        return self.run(self.catalog.load_table(name))

    def live_files(self, name: str) -> list[DataFile]:
        async def files() -> list[DataFile]:
            table = await self.catalog.load_table(name)
            head = table.metadata.current_snapshot()
            if head is None:
                return []
            reader = ManifestReader(table.io)
            out = []
            for manifest in await reader.manifests(head):
                entries = await reader.entries(manifest, table.metadata.specs(), live_only=True)
                out.extend(e.data_file for e in entries)
            return out

        return self.run(files())

    def stored_files(self, name: str) -> set[str]:
        """Every Parquet file in storage under the table's data directory."""

        async def listing() -> set[str]:
            table = await self.catalog.load_table(name)
            prefix = f"{table.metadata.location}/data"
            return {f.path async for f in table.io.list(prefix) if f.path.endswith(".parquet")}

        return self.run(listing())


@contextlib.contextmanager
def running_stack(kafka_broker: str, catalog_uri: str, warehouse: Path) -> Iterator[SparkStack]:
    """A coordinator and a planner on their own topics over ``catalog_uri``."""
    prefix = f"spark{uuid.uuid4().hex[:8]}"
    coordinator = CoordinatorThread(
        coordinator_config(
            kafka_broker, catalog_uri, prefix, topic_partitions=2, batch_max_wait_ms=50
        )
    )
    coordinator.start()
    planner = PlannerThread(
        PlannerConfig(
            catalog=catalog_uri,
            host="127.0.0.1",
            port=0,
            brokers=kafka_broker,
            results_topic=f"{prefix}.results",
            tasks_per_page=2,
            refresh_interval_ms=200,
        )
    )
    helper = LoopThread("icefloe-spark-tests")
    try:
        planner.start()
        catalog = helper.run(_open_catalog(catalog_uri))
        config = SparkConfig(
            catalog=catalog_uri,
            brokers=kafka_broker,
            events_topic=f"{prefix}.events",
            results_topic=f"{prefix}.results",
            dead_letter_topic=f"{prefix}.dead-letter",
            planner_url=planner.url,
            commit_timeout_s=120.0,
        )
        try:
            yield SparkStack(catalog_uri, warehouse, config, planner, helper, catalog)
        finally:
            import icefloe.spark

            icefloe.spark.shutdown()  # its Kafka clients must go before the broker does
            helper.run(catalog.close())
    finally:
        helper.stop()
        planner.stop()
        coordinator.stop()


@pytest.fixture(scope="module")
def spark_stack(
    kafka_broker: str, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkStack]:
    """Tables on local disk, pointers in redis."""
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    uri = f"{redis_server}?warehouse=file://{warehouse}&prefix=p{uuid.uuid4().hex[:8]}"
    with running_stack(kafka_broker, uri, warehouse) as stack:
        yield stack


@pytest.fixture(scope="module")
def s3_spark_stack(
    kafka_broker: str, redis_server: str, s3_server: S3Endpoint
) -> Iterator[SparkStack]:
    """Tables in S3 (SeaweedFS), so tasks upload and read through the S3 FileIO."""
    bucket = s3_server.create_bucket()
    query = urlencode(
        {
            "warehouse": f"s3://{bucket}/wh",
            "prefix": f"p{uuid.uuid4().hex[:8]}",
            **s3_server.file_io_properties(),
        }
    )
    with running_stack(kafka_broker, f"{redis_server}?{query}", Path("/nonexistent")) as stack:
        yield stack


async def _open_catalog(uri: str) -> Catalog:
    return load_catalog(uri)
