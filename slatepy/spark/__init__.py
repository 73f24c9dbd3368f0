"""PySpark data sources over slatepy (RFC 0016); install with ``pip install "slatepy[spark]"``.

``register(spark)`` makes the sources known to a session (registration is per session):

* ``slatepy``: a KV database read as a DataFrame, and bulk-loaded from one
  (``slatepy.spark.kv``)::

      df = spark.read.format("slatepy").option("url", URL).load()
      df.write.format("slatepy").option("url", URL).option("key", "id").mode("append").save()

* ``slatepy.persist``: a persist shard as a sink, streaming and one-off
  (``slatepy.spark.persist_sink``)::

      df.writeStream.format("slatepy.persist").option("url", URL).option("shard", S) \
          .option("checkpointLocation", CKPT).start()

Nothing below this package knows Spark; it uses the engine's pinned snapshots
(``slatepy.engine.pinned``), its ingestion of externally built SSTs
(``slatepy.engine.ingest``), the row codec (``slatepy.spark.codec``) and persist's handles.
"""

from __future__ import annotations

from typing import Any

from slatepy.errors import InvalidArgument

SOURCE_NAMES = ("slatepy", "slatepy.persist")
"""The short names :func:`register` makes usable in ``format(...)``."""


def register(spark: Any) -> None:
    """Register slatepy's data sources with the SparkSession ``spark``.

    Raises:
        InvalidArgument: pyspark or pyarrow is missing (the ``spark`` extra).
    """
    try:
        from slatepy.spark.kv import KvDataSource
        from slatepy.spark.loadgen_source import LoadGenDataSource
        from slatepy.spark.persist_sink import PersistDataSource
        from slatepy.spark.postgres_source import PostgresDataSource
    except ImportError as exc:
        raise InvalidArgument(
            f'the Spark sources need pyspark and pyarrow: pip install "slatepy[spark]" ({exc})'
        ) from exc
    spark.dataSource.register(KvDataSource)
    spark.dataSource.register(PersistDataSource)
    spark.dataSource.register(LoadGenDataSource)
    spark.dataSource.register(PostgresDataSource)
