"""One bulk-load task in this process, without Spark: ``python -m tests.spark.load_task_rss
URL ROWS BUDGET`` writes ROWS shuffled rows (``bufferBytes`` BUDGET) and prints the
process's peak RSS, in bytes (the test compares two sizes)."""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.types import BinaryType, StructField, StructType

from slatepy.spark.kv import KvWriter

SCHEMA = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])


def batches(rows: int) -> Iterator[pa.RecordBatch]:
    for start in range(0, rows, 10_000):
        ids = [(i * 7919) % rows for i in range(start, min(rows, start + 10_000))]
        keys = pa.array([b"%010d" % i for i in ids], pa.binary())
        values = pa.array([b"v%d" % i + b"x" * 90 for i in ids], pa.binary())
        yield pa.RecordBatch.from_arrays([keys, values], names=["key", "value"])


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    url, rows, budget = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    options = {"url": url, "key": "key", "value": "value", "bufferBytes": budget}
    writer = KvWriter(options, SCHEMA, overwrite=False)
    writer.commit([writer.write(batches(rows))])
    print(peak())


if __name__ == "__main__":
    main()
