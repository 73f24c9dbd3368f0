"""A Spark ingest in its own process for ``test_source_crash.py``: the publication ``pub``
into the persist shard ``orders`` (remap shard ``orders.remap``) by
``crashing_sources.py``'s source and sink, which SIGKILL this process's group at the step
``SLATEPY_TEST_CRASH`` names.

Usage: python -m tests.spark.ingest_spark_driver STORE PG_URL CHECKPOINT MODE

MODE ``stream``: a micro-batch every 0.2 s until killed; ``drain``: ``Trigger.AvailableNow``
(everything the server has written when it starts), then print DONE and exit 0.
"""

from __future__ import annotations

import sys


def main(store: str, pg_url: str, checkpoint: str, mode: str) -> None:
    from slatepy.spark.session import local_session
    from tests.spark import crashing_sources

    spark = local_session("slatepy-ingest-crash", cores=1)
    crashing_sources.register(spark)
    rows = (
        spark.readStream.format("crashing.slatepy.postgres")
        .option("connection", pg_url)
        .option("publication", "pub")
        .option("url", store)
        .option("shard", "orders")
        .option("pollSeconds", "0.2")
        .load()
    )
    writer = (
        rows.writeStream.format("crashing.slatepy.persist")
        .option("url", store)
        .option("shard", "orders")
        .option("timeColumn", "time")
        .option("checkpointLocation", checkpoint)
    )
    if mode == "drain":
        query = writer.trigger(availableNow=True).start()
    else:
        query = writer.trigger(processingTime="0.2 seconds").start()
    while not query.awaitTermination(5):  # progress for a failing test's message
        progress = query.lastProgress or {}
        sources = progress.get("sources") or [{}]
        print(
            f"batch {progress.get('batchId')}: {progress.get('numInputRows')} rows, "
            f"end {sources[0].get('endOffset')}",
            flush=True,
        )
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
