"""A Spark driver in its own process for the crash tests (``test_persist_sink.py``): a
streaming query from the JSON files of ``input_dir`` (one file per micro-batch) into a
persist shard, with ``Trigger.AvailableNow``, restartable from its checkpoint. The test
SIGKILLs this process's whole group (the Python driver, the JVM, its Python workers).

Usage: python persist_sink_driver.py URL SHARD INPUT_DIR CHECKPOINT [KILL_MARKER]

With ``KILL_MARKER`` the sink is ``tests/spark/failing.py``'s: the first commit kills the
driver's process group right after its append landed (creating the marker), before Spark
records the commit.
"""

from __future__ import annotations

import sys


def main(url: str, shard: str, input_dir: str, checkpoint: str, marker: str | None) -> None:
    from slatepy.spark.session import local_session
    from tests.spark import failing

    spark = local_session("slatepy-sink-driver", cores=1)
    failing.register(spark)
    rows = (
        spark.readStream.format("json")
        .schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .load(input_dir)
    )
    writer = (
        rows.writeStream.format("slatepy.persist")
        .option("url", url)
        .option("shard", shard)
        .option("checkpointLocation", checkpoint)
    )
    if marker is not None:
        writer = writer.format("failing.slatepy.persist").options(fault="killgroup", once=marker)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5], sys.argv[5] if len(sys.argv) > 5 else None)
