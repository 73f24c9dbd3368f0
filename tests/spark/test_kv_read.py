"""``spark.read.format("slatepy")``: one pinned snapshot, split along SST boundaries.

A database of a sorted run of several SSTs plus newer writes still in the WAL (overwrites and
deletes of compacted keys), read through Spark and directly through the reader's planning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark.sql.types import (
    BinaryType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from slatepy import Db, Settings, WriteBatch, clone
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.engine.clone import with_external
from slatepy.errors import InvalidArgument
from slatepy.manifest.store import ManifestStore
from slatepy.spark.codec import Column, RowCodec
from slatepy.spark.kv import KvDataSource, KvReader
from slatepy.store import open_store

OFF = Settings(compactor="off")
N = 20_000
SCHEMA = "id long, name string, score double"
CODEC = RowCodec.of(
    (Column("id", "long"), Column("name", "string"), Column("score", "double")), ["id"], None
)


def put_rows(db: Db, rows: dict[int, tuple[str | None, float]]) -> None:
    ids = sorted(rows)
    keys = CODEC.encode_keys([ids])
    values = CODEC.encode_values(
        {1: [rows[i][0] for i in ids], 2: [rows[i][1] for i in ids]}, len(ids)
    )
    batch = WriteBatch()
    for k, v in zip(keys, values, strict=True):
        batch.put(k, v)
    db.write(batch)


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[int, tuple[Any, float]]]:
    """A run of several compacted SSTs, then overwrites, deletes and new keys in the WAL."""
    url = f"file://{tmp_path_factory.mktemp('kv')}/db"
    expected: dict[int, tuple[Any, float]] = {}
    with Db.open(url, settings=OFF) as db:
        for first in range(0, N, 2000):
            rows = {i: (f"name{i}" * 5, i / 2) for i in range(first, first + 2000)}
            put_rows(db, rows)
            expected.update(rows)
    policy = CompactionPolicy(l0_trigger=1, target_sst_bytes=128 * 1024)
    Compactor(open_store(url), settings=OFF, policy=policy).run_until_idle()
    with Db.open(url, settings=OFF) as db:
        newer = {i: (None if i % 2 else "new", -1.0) for i in range(-50, N + 50, 97)}
        put_rows(db, newer)
        expected.update(newer)
        for i in range(5, N, 1000):
            db.delete(CODEC.encode_keys([[i]])[0])
            expected.pop(i, None)
        db.flush()
    stored = ManifestStore(open_store(url)).load()
    assert stored is not None and len(stored.manifest.sorted_runs[0].ssts) >= 4
    return url, expected


def read(spark: Any, url: str, **options: str) -> Any:
    reader = spark.read.format("slatepy").schema(SCHEMA).option("url", url).option("key", "id")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def rows_of(df: Any) -> dict[int, tuple[Any, float]]:
    return {r["id"]: (r["name"], r["score"]) for r in df.collect()}


@pytest.mark.spark
def test_a_read_agrees_with_the_database(spark: Any, database: tuple[str, dict[int, Any]]) -> None:
    url, expected = database
    df = read(spark, url)
    assert df.rdd.getNumPartitions() >= 4  # one per SST of the run
    assert rows_of(df) == expected
    raw = spark.read.format("slatepy").load(url)  # no schema: the raw bytes
    assert raw.schema.simpleString() == "struct<key:binary,value:binary>"
    with Db.open(url, settings=OFF) as db:
        assert sorted((bytes(r.key), bytes(r.value)) for r in raw.collect()) == list(db.scan())


@pytest.mark.spark
def test_a_key_range_cuts_the_partitions(spark: Any, database: tuple[str, dict[int, Any]]) -> None:
    url, expected = database
    everything = read(spark, url).rdd.getNumPartitions()
    df = read(spark, url, start="3000", end="4500")
    assert df.rdd.getNumPartitions() < everything
    assert rows_of(df) == {i: v for i, v in expected.items() if 3000 <= i < 4500}
    assert read(spark, url, start="-10", end="-10").count() == 0


@pytest.mark.spark
def test_a_dataframe_counted_after_a_filtered_derivative_returns_all_rows(
    spark: Any, database: tuple[str, dict[int, Any]]
) -> None:
    url, expected = database
    df = read(spark, url)
    assert df.where("id >= 40 AND id < 44").count() == len([i for i in expected if 40 <= i < 44])
    assert df.count() == len(expected)
    ranged = read(spark, url, end="100")
    assert ranged.where("id >= 40 AND id < 44").count() == len(
        [i for i in expected if 40 <= i < 44]
    )
    assert ranged.count() == len([i for i in expected if i < 100])


@pytest.mark.spark
def test_bad_options_fail_the_read_naming_the_option(
    spark: Any, database: tuple[str, dict[int, Any]]
) -> None:
    url, _ = database
    with pytest.raises(Exception, match=r"unknown option.*'strat'"):
        read(spark, url, strat="1").count()
    with pytest.raises(Exception, match="option 'key': no column 'nope'"):
        spark.read.format("slatepy").schema(SCHEMA).option("url", url).option(
            "key", "nope"
        ).load().count()


def schema(ddl: str) -> StructType:
    """``StructType.fromDDL`` without a Spark session (it needs one; these tests do not)."""
    types = {
        "long": LongType(),
        "string": StringType(),
        "double": DoubleType(),
        "binary": BinaryType(),
        "timestamp": TimestampType(),
    }
    fields = [column.split() for column in ddl.split(",")]
    return StructType([StructField(name, types[kind]) for name, kind in fields])


def test_planning_refuses_bad_options_before_reading(database: tuple[str, Any]) -> None:
    url, _ = database
    cases = [
        ({"key": "id"}, SCHEMA, "option 'url' is required"),
        ({"url": url}, SCHEMA, "option 'key': no column 'key'"),
        ({"url": url, "key": "id", "start": "x"}, SCHEMA, "option 'start': 'x' is not an"),
        ({"url": url, "key": "id", "prefix": "1"}, SCHEMA, "option 'prefix'"),
        ({"url": url, "key": "id", "maxPartitions": "0"}, SCHEMA, "option 'maxPartitions'"),
        ({"url": url, "key": "id"}, "id long, t timestamp", "column 't'"),
        ({"url": url, "key": "id", "value": "name"}, SCHEMA, "option 'value'"),
    ]
    for options, ddl, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            KvReader(options, schema(ddl))
    with pytest.raises(InvalidArgument, match="option 'key'/'value' needs the row schema"):
        KvDataSource({"url": url, "key": "id"}).schema()


def test_a_prefix_reads_the_keys_that_start_with_it(tmp_path: Path) -> None:
    """Planning and reading without Spark: string keys, a prefix, max partitions."""
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=OFF) as db:
        batch = WriteBatch()
        for i in range(3000):
            batch.put(b"user%05d" % i, b"v%d" % i)
        batch.put(b"usex", b"x")
        db.write(batch)
    policy = CompactionPolicy(l0_trigger=1, target_sst_bytes=16 * 1024)
    Compactor(open_store(url), settings=OFF, policy=policy).run_until_idle()
    options = {"url": url, "key": "k", "value": "v", "prefix": "user01", "maxPartitions": "2"}
    reader = KvReader(options, schema("k string, v binary"))
    parts = reader.partitions()
    assert 1 <= len(parts) <= 2
    batches = [b for p in parts for b in reader.read(p)]
    keys = [k for b in batches for k in b.column(0).to_pylist()]
    assert keys == [f"user{i:05d}" for i in range(1000, 2000)]
    assert batches[0].schema == reader.codec.arrow_schema()


@pytest.mark.spark
def test_a_read_of_a_clone_sees_its_shared_and_its_own_ssts(spark: Any, tmp_path: Path) -> None:
    """A clone's shared SSTs live in its source's store: planning and every task read them
    there (RFC 0017), next to the clone's own SSTs and WAL."""
    src, dst = f"file://{tmp_path}/src", f"file://{tmp_path}/dst"
    rows = {i: (f"src{i}", float(i)) for i in range(3000)}
    with Db.open(src, settings=OFF) as db:
        put_rows(db, rows)
    policy = CompactionPolicy(l0_trigger=1, target_sst_bytes=32 * 1024)
    Compactor(open_store(src), settings=OFF, policy=policy).run_until_idle()
    clone(src, dst, settings=OFF)
    with Db.open(dst, settings=OFF) as db:
        own = {i: ("clone", -1.0) for i in range(-20, 3020, 7)}
        put_rows(db, own)
        rows |= own
    keep_runs = CompactionPolicy(l0_trigger=100)  # the WAL into an L0 SST of the clone's own
    Compactor(with_external(dst, OFF), settings=OFF, policy=keep_runs).run_until_idle()
    with Db.open(dst, settings=OFF) as db:
        newest = {i: ("wal", -2.0) for i in range(1, 3000, 500)}
        put_rows(db, newest)
        rows |= newest
    stored = ManifestStore(open_store(dst)).load()
    assert stored is not None
    m = stored.manifest
    shared = {i for e in m.external_dbs for i in e.sst_ids}
    assert len(m.sorted_runs[0].ssts) >= 2 and {h.id for h in m.sorted_runs[0].ssts} <= shared
    assert len(m.l0) == 1 and m.l0[0].id not in shared
    df = read(spark, dst)
    assert df.rdd.getNumPartitions() >= 2
    assert rows_of(df) == rows
