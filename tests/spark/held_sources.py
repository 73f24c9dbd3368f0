"""A Spark PostgreSQL source whose first slot open is held (tests only;
``test_postgres_conflict.py``), as ``tests/sources/test_postgres_concurrent.py``'s
``HeldOpen`` holds the in-process one: the stream has read the shards' uppers and not yet
the slot.

The stream reader runs in a Python process the JVM starts, so the hold is by files in the
directory of the option ``holdDir``: the source writes ``opening`` (the LSN it opens at)
and waits (60 s at most) until ``proceed`` exists; then it waits 0.5 s (not 5 s) for another
session to let go of the slot. :func:`stream` starts a query of it, or of the plain source
(``test_postgres_source.py``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from slatepy.sources.base import OffsetFrontier
from slatepy.sources.postgres import PostgresReader, PostgresSource
from slatepy.spark.postgres_source import (
    PostgresDataSource,
    PostgresStreamReader,
    postgres_config,
)


class HeldSource(PostgresSource):
    slot_wait = 0.5  # the other ingest's walsender is terminated after 0.5 s (not 5 s)

    def __init__(self, url: str, publication: str, *, slot: str, hold: Path) -> None:
        super().__init__(url, publication, slot=slot)
        self.hold = hold

    def open(self, resume: OffsetFrontier) -> PostgresReader:
        opening = self.hold / "opening"
        if not opening.exists():
            opening.write_text(str(resume[0]))
            deadline = time.monotonic() + 60
            while not (self.hold / "proceed").exists():
                assert time.monotonic() < deadline, "never told to proceed"
                time.sleep(0.05)
        return super().open(resume)


class HeldPostgresReader(PostgresStreamReader):
    def __init__(self, config: Any, hold: Path) -> None:
        super().__init__(config)
        cfg = self.config
        self._source = HeldSource(cfg.connection, cfg.publication, slot=cfg.slot, hold=hold)

    def __getstate__(self) -> dict[str, Any]:
        assert isinstance(self._source, HeldSource)
        return {"config": self.config, "hold": self._source.hold}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"], state["hold"])  # type: ignore[misc]


class HeldPostgres(PostgresDataSource):
    @classmethod
    def name(cls) -> str:
        return "held.slatepy.postgres"

    def streamReader(self, schema: Any) -> PostgresStreamReader:
        options = {str(k): str(v) for k, v in self.options.items()}
        hold = next(v for k, v in options.items() if k.lower() == "holddir")
        config = postgres_config({k: v for k, v in options.items() if k.lower() != "holddir"})
        return HeldPostgresReader(config, Path(hold))


def register(spark: Any) -> None:
    """Register the source on ``spark`` (by value: the JVM's Python processes need not
    import ``tests``)."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(HeldPostgres)


def stream(spark: Any, pg: str, store: str, checkpoint: Path, *, hold: Path | None) -> Any:
    """A ``Trigger.AvailableNow`` query of ``slatepy.postgres`` into the data shard
    ``orders``; its first slot open held by ``hold``'s files when given."""
    fmt = "slatepy.postgres" if hold is None else "held.slatepy.postgres"
    reader = (
        spark.readStream.format(fmt)
        .option("connection", pg)
        .option("publication", "pub")
        .option("url", store)
        .option("shard", "orders")
    )
    if hold is not None:
        reader = reader.option("holdDir", str(hold))
    return (
        reader.load()
        .writeStream.format("slatepy.persist")
        .option("url", store)
        .option("shard", "orders")
        .option("timeColumn", "time")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
