"""Reading a persist shard from Spark (RFC 0016, "Persist source"): the consolidated
snapshot as of a time, and the stream of updates with uppers as offsets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slatepy.errors import InvalidArgument
from slatepy.persist import PersistClient

pytestmark = pytest.mark.spark

SHARD = "events"


def fill(url: str, batches: list[tuple[int, int, list[tuple[bytes, int, int]]]]) -> None:
    """Append ``(lower, upper, [(key, time, diff)])`` batches (values ``v`` + key)."""
    with PersistClient.open(url) as client:
        write = client.open_writer(SHARD)
        for lower, upper, rows in batches:
            updates = [((k, b"v" + k), t, d) for k, t, d in rows]
            write.compare_and_append(updates, lower, upper)
        write.expire()


def rows_of(df: Any) -> list[tuple[bytes, bytes, int, int]]:
    return sorted((bytes(r.key), bytes(r.value), r.time, r.diff) for r in df.collect())


def test_options_are_checked_without_spark() -> None:
    pytest.importorskip("pyspark")
    from slatepy.spark.persist_source import source_config

    with pytest.raises(InvalidArgument, match='"shard"'):
        source_config({"url": "memory://"}, stream=False)
    with pytest.raises(InvalidArgument, match='"asOf"'):
        source_config({"url": "memory://", "shard": SHARD, "as_of": "x"}, stream=False)
    with pytest.raises(InvalidArgument, match="startingOffsets"):
        source_config({"url": "memory://", "shard": SHARD, "startingOffsets": "x"}, stream=True)
    with pytest.raises(InvalidArgument, match="maxRowsPerTrigger"):
        source_config({"url": "memory://", "shard": SHARD, "maxRowsPerTrigger": "0"}, stream=True)
    with pytest.raises(InvalidArgument, match="as_of"):  # a stream has no as_of
        source_config({"url": "memory://", "shard": SHARD, "as_of": "1"}, stream=True)
    config = source_config({"URL": "memory://", "Shard": SHARD, "pollInterval": "2"}, stream=True)
    assert config.poll_interval == 2.0


def test_a_snapshot_read_as_of_a_time(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/persist"
    fill(
        url,
        [
            (0, 2, [(b"a", 0, 1), (b"b", 1, 1)]),
            (2, 4, [(b"a", 2, -1), (b"c", 3, 2)]),
        ],
    )

    def read(**options: str) -> Any:
        reader = spark.read.format("slatepy.persist").option("url", url).option("shard", SHARD)
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load()

    assert read().columns == ["key", "value", "time", "diff"]
    assert rows_of(read(as_of="1")) == [(b"a", b"va", 1, 1), (b"b", b"vb", 1, 1)]
    assert rows_of(read()) == [(b"b", b"vb", 3, 1), (b"c", b"vc", 3, 2)]  # asOf 3
    assert rows_of(read(asOf="3")) == rows_of(read())
    with pytest.raises(Exception, match="asOf"):
        read(as_of="4").collect()  # not complete yet
    with pytest.raises(Exception, match="bogus"):
        read(bogus="1").collect()
    with PersistClient.open(url) as client:
        holder = client.open_leased_reader(SHARD)
        holder.downgrade_since(2)  # the shard's since is now 2: as_of 1 is compacted away
        with pytest.raises(Exception, match="since"):
            read(as_of="1").collect()
        assert rows_of(read(as_of="2")) == [(b"b", b"vb", 2, 1)]
        holder.expire()


def test_a_stream_reads_the_snapshot_then_each_range_with_its_times(
    spark: Any, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}/persist"
    fill(url, [(0, 2, [(b"a", 0, 1), (b"b", 1, 1)])])

    def run() -> list[tuple[bytes, bytes, int, int]]:
        got: list[tuple[bytes, bytes, int, int]] = []
        stream = (
            spark.readStream.format("slatepy.persist")
            .option("url", url)
            .option("shard", SHARD)
            .load()
        )
        query = (
            stream.writeStream.foreachBatch(lambda df, _: got.extend(rows_of(df)))
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None
        return sorted(got)

    # The first micro-batch: the snapshot as of upper - 1.
    assert run() == [(b"a", b"va", 1, 1), (b"b", b"vb", 1, 1)]
    fill(url, [(2, 5, [(b"a", 2, -1), (b"c", 4, 1)])])
    # Restarted from the checkpoint: only [2, 5), at the updates' own times.
    assert run() == [(b"a", b"va", 2, -1), (b"c", b"vc", 4, 1)]


def test_commit_downgrades_the_readers_since(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from slatepy.spark.persist_source import PersistStreamReader, source_config

    url = f"file://{tmp_path}/persist"
    fill(url, [(0, 3, [(b"a", 0, 1)]), (3, 6, [(b"b", 4, 1)])])
    reader = PersistStreamReader(source_config({"url": url, "shard": SHARD}, stream=True))
    try:
        end = reader.latestOffset(reader.initialOffset(), None)
        assert end == {"shard": SHARD, "upper": 6}
        assert reader.latestOffset(end, None) == end  # cached: no new poll
        assert reader.partitions(end, end) == []
        reader.commit({"shard": SHARD, "upper": 3})
        with PersistClient.open(url) as client:
            assert client.machine(SHARD).fetch().since == 2
        with pytest.raises(InvalidArgument, match="shard"):
            reader.partitions({"shard": "other", "upper": 0}, end)
    finally:
        reader.stop()


def test_max_rows_per_trigger_and_starting_offsets(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from slatepy.spark.persist_source import PersistStreamReader, source_config

    url = f"file://{tmp_path}/persist"
    fill(url, [(t, t + 1, [(b"k%d-%d" % (t, i), t, 1) for i in range(10)]) for t in range(5)])
    options = {"url": url, "shard": SHARD, "maxRowsPerTrigger": "20"}
    reader = PersistStreamReader(source_config(options, stream=True))
    try:
        limit = reader.getDefaultReadLimit()
        assert limit == ReadMaxRows(20)
        ends = [reader.initialOffset()]
        while ends[-1]["upper"] < 5:
            ends.append(reader.latestOffset(ends[-1], limit))
        assert [e["upper"] for e in ends] == [0, 2, 4, 5]  # 20, 20, 10 rows
        assert reader.latestOffset(ends[0], ReadAllAvailable())["upper"] == 5
    finally:
        reader.stop()
    latest = PersistStreamReader(
        source_config({"url": url, "shard": SHARD, "startingOffsets": "latest"}, stream=True)
    )
    try:
        assert latest.initialOffset()["upper"] == 5
    finally:
        latest.stop()

    sizes: list[int] = []
    stream = spark.readStream.format("slatepy.persist").options(**options).load()
    query = (
        stream.writeStream.foreachBatch(lambda df, _: sizes.append(df.count()))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert sizes == [20, 20, 10]
