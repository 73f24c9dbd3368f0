"""A persist snapshot read split by key range across Spark partitions (option
``maxPartitions``; RFC 0025, Addendum A): the rows are exactly the
one-partition read's, keys retracted in later batches included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from slatepy.persist import PersistClient, PersistSettings

pytestmark = pytest.mark.spark

SHARD = "events"
SMALL_PARTS = PersistSettings(inline_part_max_bytes=0, part_target_bytes=1024)
Row = tuple[bytes, bytes, int, int]


def fill(url: str) -> None:
    """Three batches of blob parts: inserts, then retractions and replacements of them."""
    keys = [b"key%04d" % i for i in range(400)]
    batches = [
        [((k, b"a"), 0, 1) for k in keys],
        [((k, b"a"), 1, -1) for k in keys[::2]] + [((k, b"b"), 1, 2) for k in keys[::3]],
        [((k, b"a"), 2, 1) for k in keys[::4]] + [((k, b"b"), 2, -2) for k in keys[::6]],
    ]
    with PersistClient.open(url, settings=SMALL_PARTS) as client:
        write = client.open_writer(SHARD)
        for t, updates in enumerate(batches):
            write.compare_and_append(updates, t, t + 1)
        write.expire()


def expected() -> list[Row]:
    rows = []
    for i in range(400):
        key = b"key%04d" % i
        a = 1 - (i % 2 == 0) + (i % 4 == 0)
        b = 2 * (i % 3 == 0) - 2 * (i % 6 == 0)
        rows += [(key, v, 2, d) for v, d in ((b"a", a), (b"b", b)) if d]
    return rows


def rows_of_batches(batches: list[pa.RecordBatch]) -> list[Row]:
    table = pa.Table.from_batches(batches)
    return sorted(zip(*(table.column(n).to_pylist() for n in table.column_names), strict=True))


def test_the_readers_split_a_snapshot_into_exact_key_ranges(tmp_path: Path) -> None:
    """Without Spark: the batch reader's and the stream's first micro-batch partitions."""
    from slatepy.spark.persist_source import (
        PersistSnapshotReader,
        PersistStreamReader,
        source_config,
    )

    url = f"file://{tmp_path}/persist"
    fill(url)
    options = {"url": url, "shard": SHARD, "maxPartitions": "4"}
    reader = PersistSnapshotReader(source_config(options, stream=False))
    parts = reader.partitions()
    assert len(parts) == 4
    assert rows_of_batches([b for p in parts for b in reader.read(p)]) == expected()
    one = PersistSnapshotReader(source_config({**options, "maxPartitions": "1"}, stream=False))
    (whole,) = one.partitions()
    assert rows_of_batches(list(one.read(whole))) == expected()  # the one-partition read
    stream = PersistStreamReader(source_config(options, stream=True))
    try:
        first = stream.partitions({"shard": SHARD, "upper": 0}, {"shard": SHARD, "upper": 3})
        assert len(first) == 4
        assert rows_of_batches([b for p in first for b in stream.read(p)]) == expected()
        assert (
            len(stream.partitions({"shard": SHARD, "upper": 1}, {"shard": SHARD, "upper": 3})) == 1
        )
    finally:
        stream.stop()


def test_a_snapshot_read_uses_several_spark_partitions(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/persist"
    fill(url)

    def read(pieces: str) -> Any:
        return (
            spark.read.format("slatepy.persist")
            .option("url", url)
            .option("shard", SHARD)
            .option("maxPartitions", pieces)
            .load()
        )

    split = read("3")
    assert split.rdd.getNumPartitions() == 3
    rows = sorted((bytes(r.key), bytes(r.value), r.time, r.diff) for r in split.collect())
    assert rows == expected()  # the one-partition read's rows (the test above)
