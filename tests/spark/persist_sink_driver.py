"""A Spark driver in its own process for the crash tests (``test_persist_sink.py``): a
streaming query from the JSON files of ``input_dir`` (one file per micro-batch) into a
persist shard, with ``Trigger.AvailableNow``, restartable from its checkpoint. The test
SIGKILLs this process's whole group (the Python driver, the JVM, its Python workers).

Usage: python persist_sink_driver.py URL SHARD INPUT_DIR CHECKPOINT
"""

from __future__ import annotations

import sys


def main(url: str, shard: str, input_dir: str, checkpoint: str) -> None:
    from slatepy.spark.session import local_session

    spark = local_session("slatepy-sink-driver", cores=1)
    rows = (
        spark.readStream.format("json")
        .schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .load(input_dir)
    )
    query = (
        rows.writeStream.format("slatepy.persist")
        .option("url", url)
        .option("shard", shard)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
