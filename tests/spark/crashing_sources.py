"""The Spark PostgreSQL source and persist sink that SIGKILL their driver at a named step
(tests only; ``test_source_crash.py``).

``SLATEPY_TEST_CRASH=POINT:N:LOG`` in the driver's environment (Spark's Python workers
inherit it): each time a step named ``POINT`` completes, a line is appended to the file
``LOG``; the ``N``-th kills the driver's process group (the driver, its JVM and workers, as
``failing.py``'s ``killgroup``). The steps are the in-process ingest's hook points:
``remap-appended`` (the driver bound a batch's end in the remap shard), ``data-appended``
(the sink's append landed, before Spark records the batch) and ``committed`` (the source
sent the slot its standby status update at the shards' resumption frontier).

Deterministic: the kill is at the step, not after a delay.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from slatepy.sources.base import OffsetFrontier
from slatepy.spark.persist_sink import PersistDataSource, PersistStreamWriter, sink_config
from slatepy.spark.postgres_source import PostgresDataSource, PostgresStreamReader
from slatepy.spark.reclocked import Reclocked
from tests.spark.failing import fail

ENV = "SLATEPY_TEST_CRASH"


def reached(point: str) -> None:
    """Record that ``point`` completed; kill the driver at the configured occurrence."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    at, count, path = spec.split(":", 2)
    if at != point:
        return
    with open(path, "a") as out:
        out.write(f"{point} {os.getpid()}\n")
    with open(path) as seen:
        if sum(1 for _ in seen) == int(count):
            fail("killgroup", None)


class CrashingReclocked(Reclocked):
    def end(self, start: OffsetFrontier, candidate: OffsetFrontier) -> OffsetFrontier:
        before = self.bindings.upper
        out = super().end(start, candidate)
        if self.bindings.upper != before:
            reached("remap-appended")
        return out


class CrashingPostgresReader(PostgresStreamReader):
    def __init__(self, config: Any) -> None:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        super().__init__(config)
        self._state = CrashingReclocked(config.url, config.consensus, config.shard)

    def commit(self, end: dict[str, Any]) -> None:
        before = self._stream._committed if self._stream is not None else None
        super().commit(end)
        if self._stream is not None and self._stream._committed != before:
            reached("committed")


class CrashingPostgres(PostgresDataSource):
    @classmethod
    def name(cls) -> str:
        return "crashing.slatepy.postgres"

    def streamReader(self, schema: Any) -> PostgresStreamReader:
        reader = super().streamReader(schema)
        assert isinstance(reader, PostgresStreamReader)
        return CrashingPostgresReader(reader.config)


class CrashingPersistStreamWriter(PersistStreamWriter):
    def commit(self, messages: Any, batchId: int) -> None:
        super().commit(messages, batchId)
        reached("data-appended")


class CrashingPersist(PersistDataSource):
    @classmethod
    def name(cls) -> str:
        return "crashing.slatepy.persist"

    def streamWriter(self, schema: Any, overwrite: bool) -> PersistStreamWriter:
        return CrashingPersistStreamWriter(sink_config(self.options, schema, stream=True))


def register(spark: Any) -> None:
    """Register both on ``spark`` (by value: workers need not import ``tests``)."""
    from pyspark import cloudpickle

    from tests.spark import failing

    cloudpickle.register_pickle_by_value(failing)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(CrashingPostgres)
    spark.dataSource.register(CrashingPersist)
