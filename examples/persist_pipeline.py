"""A streaming pipeline into a persist shard and back out (RFC 0016).

    python examples/persist_pipeline.py [WORKDIR]

1. Writes a few JSON files of ``{"key", "value"}`` rows into ``WORKDIR/input`` (the
   "source system").
2. Streams them into the shard ``orders`` at ``file://WORKDIR/persist`` with a file source
   (one file per micro-batch) and the ``slatepy.persist`` sink, exactly once per micro-batch
   (the checkpoint is ``WORKDIR/ckpt-sink``). ``Trigger.AvailableNow`` ends the query when
   every file is in; a long-running job would leave the trigger out.
3. Reads the shard back as a stream (``spark.readStream.format("slatepy.persist")``, its own
   checkpoint) and prints each micro-batch's updates, then a snapshot of the shard.

Run it twice: the second run's sink finds nothing new in its checkpoint, and the reader
continues where it stopped.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

SHARD = "orders"


def write_input(directory: Path, files: int = 3, rows: int = 5) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with open(directory / f"orders-{f:03}.json", "w") as out:
            for r in range(rows):
                order = f"order-{f:03}-{r:02}"
                out.write(json.dumps({"key": order, "value": f"qty={r + 1}"}) + "\n")


def run_pipeline(spark: Any, workdir: Path) -> dict[str, Any]:
    """Run steps 1-3 in ``spark`` (``slatepy.spark.register`` already called); answer what
    the stream read and the snapshot held."""
    url = f"file://{workdir}/persist"
    write_input(workdir / "input")
    rows = (
        spark.readStream.format("json")
        .schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .load(str(workdir / "input"))
    )
    sink = (
        rows.writeStream.format("slatepy.persist")
        .option("url", url)
        .option("shard", SHARD)
        .option("checkpointLocation", str(workdir / "ckpt-sink"))
        .trigger(availableNow=True)
        .start()
    )
    sink.awaitTermination()

    streamed: list[tuple[int, str, str, int, int]] = []

    def show(batch: Any, batch_id: int) -> None:
        for row in batch.orderBy("time", "key").collect():
            key, value = bytes(row.key).decode(), bytes(row.value).decode()
            streamed.append((batch_id, key, value, row.time, row.diff))
            print(f"listen batch {batch_id}: {key} {value} @{row.time} {row.diff:+d}")

    listen = (
        spark.readStream.format("slatepy.persist")
        .option("url", url)
        .option("shard", SHARD)
        .load()
        .writeStream.foreachBatch(show)
        .option("checkpointLocation", str(workdir / "ckpt-listen"))
        .trigger(availableNow=True)
        .start()
    )
    listen.awaitTermination()
    snapshot = spark.read.format("slatepy.persist").option("url", url).option("shard", SHARD)
    snapshot_rows = snapshot.load().collect()
    print(f"snapshot: {len(snapshot_rows)} keys, as of {max(r.time for r in snapshot_rows)}")
    return {"streamed": streamed, "snapshot": snapshot_rows}


def main() -> None:
    from pyspark.sql import SparkSession

    import slatepy.spark

    workdir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("slatepy-persist-pipeline")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    slatepy.spark.register(spark)
    try:
        run_pipeline(spark, workdir.resolve())
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
