"""A Spark driver in its own process for the crash tests (``test_persist_sink.py``): a
streaming query from the JSON files of ``input_dir`` (one file per micro-batch) into a
persist shard, with ``Trigger.AvailableNow``, restartable from its checkpoint. The test
SIGKILLs this process's whole group (the Python driver, the JVM, its Python workers).

Usage: python persist_sink_driver.py URL SHARD INPUT_DIR CHECKPOINT
"""

from __future__ import annotations

import os
import sys


def main(url: str, shard: str, input_dir: str, checkpoint: str) -> None:
    from pyspark.sql import SparkSession

    import slatepy.spark

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("slatepy-sink-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    slatepy.spark.register(spark)
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
