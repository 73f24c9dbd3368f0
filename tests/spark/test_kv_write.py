"""The bulk load ``df.write.format("slatepy")``: SSTs from the tasks, one ingestion.

Against real Spark (the session fixture) and ``file://`` databases.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from slatepy import Db, DbReader, Settings
from slatepy.compactor import Compactor
from slatepy.gc import GarbageCollector
from slatepy.manifest.store import ManifestStore
from slatepy.spark.codec import Column, RowCodec
from slatepy.store import open_store

pytestmark = pytest.mark.spark

OFF = Settings(compactor="off")
SCHEMA = "id long, name string, score double"
CODEC = RowCodec.of(
    (Column("id", "long"), Column("name", "string"), Column("score", "double")), ["id"], None
)


def new_db(tmp_path: Path) -> str:
    url = f"file://{tmp_path}/db"
    Db.open(url, settings=OFF).close()
    return url


def load(df: Any, url: str, **options: str) -> None:
    writer = df.write.format("slatepy").option("url", url).option("key", "id")
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.mode("append").save()


def key(i: int) -> bytes:
    return CODEC.encode_keys([[i]])[0]


def name_of(value: bytes | None) -> Any:
    return None if value is None else CODEC.decode_values([value])[1][0]


def compacted_objects(url: str) -> list[str]:
    return [m.path for m in open_store(url).list("compacted/")]


def test_a_bulk_load_of_200k_rows_reads_back_the_same(spark: Any, tmp_path: Path) -> None:
    url = new_db(tmp_path)
    n = 200_000
    df = spark.range(n).selectExpr(
        "id * 7919 % 1000003 - 500000 AS id",
        "concat('name', id) AS name",
        "CAST(id AS DOUBLE) / 2 AS score",
    )
    load(df, url, targetSstBytes=str(1 << 20))
    with Db.open(url, settings=OFF) as db:
        pairs = list(db.scan())
        assert len(pairs) == n
        ids = CODEC.decode_keys([k for k, _ in pairs])[0]
        expected = {i * 7919 % 1000003 - 500000: (f"name{i}", i / 2) for i in range(n)}
        assert ids == sorted(expected)
        values = CODEC.decode_values([v for _, v in pairs])
        assert list(zip(values[1], values[2], strict=True)) == [expected[i] for i in ids]
        assert name_of(db.get(key(-500000))) == "name0"
        assert name_of(db.get(key(7919 - 500000))) == "name1"
    read = spark.read.format("slatepy").schema(SCHEMA).option("url", url).option("key", "id")
    back = read.load()
    assert back.count() == n
    assert df.exceptAll(back).count() == 0 and back.exceptAll(df).count() == 0


def test_a_load_racing_a_live_writer_keeps_newest_wins(spark: Any, tmp_path: Path) -> None:
    url = new_db(tmp_path)
    df = spark.range(1000).selectExpr("id", "'loaded' AS name", "CAST(0 AS DOUBLE) AS score")
    with Db.open(url, settings=OFF) as db:
        for i in range(50):  # acknowledged before the load: the load wins
            db.put(key(i), CODEC.encode_values({1: ["before"], 2: [1.0]}, 1)[0])
        stop = threading.Event()

        live = [10_000]

        def keep_writing() -> None:  # keys the load does not touch, all through the load
            while not stop.is_set():
                db.put(key(live[0]), CODEC.encode_values({1: ["live"], 2: [2.0]}, 1)[0])
                live[0] += 1

        writer = threading.Thread(target=keep_writing)
        writer.start()
        try:
            load(df, url)
        finally:
            stop.set()
            writer.join()
        assert live[0] > 10_010  # the writer kept writing while the load ran
        for i in range(25, 75):  # after the load: these win
            db.put(key(i), CODEC.encode_values({1: ["after"], 2: [3.0]}, 1)[0])
        db.refresh()

        def expected(i: int) -> str:
            return "after" if 25 <= i < 75 else "loaded"

        def check(get_many: Any, scan: Any) -> None:
            got = [name_of(v) for v in get_many([key(i) for i in range(1000)])]
            assert got == [expected(i) for i in range(1000)]
            names = {
                i: name_of(v)
                for i, v in zip(
                    CODEC.decode_keys([k for k, _ in scan])[0], [v for _, v in scan], strict=True
                )
            }
            assert all(names[i] == expected(i) for i in range(1000))
            assert all(v == "live" for i, v in names.items() if i >= 10_000)

        assert name_of(db.get(key(10))) == "loaded"  # the writer's memtable holds "before"
        assert name_of(db.get(key(30))) == "after"
        check(db.get_many, list(db.scan()))
        with DbReader.open(url, settings=OFF) as reader:
            assert name_of(reader.get(key(10))) == "loaded"
            check(reader.get_many, list(reader.scan()))
        Compactor(open_store(url), settings=OFF).run_until_idle()  # stamps the global seq
        db.refresh()
        check(db.get_many, list(db.scan()))
    with Db.open(url, settings=OFF) as db:  # a new writer starts above the load
        db.put(key(0), CODEC.encode_values({1: ["reopened"], 2: [4.0]}, 1)[0])
        assert name_of(db.get(key(0))) == "reopened"
        assert name_of(db.get(key(1))) == "loaded"
    rows = spark.read.format("slatepy").schema(SCHEMA).option("url", url).option("key", "id")
    got = {r.id: r.name for r in rows.load().where("id < 1000").collect()}
    assert got == {i: "reopened" if i == 0 else expected(i) for i in range(1000)}


def test_an_aborted_load_leaves_nothing_visible(spark: Any, tmp_path: Path) -> None:
    url = new_db(tmp_path)
    before = ManifestStore(open_store(url)).load()
    # Two partitions: the first writes its SSTs, the second holds a null key and fails.
    df = spark.createDataFrame(
        [(i, "x", 1.0) for i in range(100)] + [(None, "y", 2.0)], SCHEMA
    ).repartitionByRange(2, "score")
    with pytest.raises(Exception, match="option 'key': key column 'id' holds a null"):
        load(df, url)
    after = ManifestStore(open_store(url)).load()
    assert before is not None and after is not None
    assert after.manifest.l0 == before.manifest.l0 == ()
    with Db.open(url, settings=OFF) as db:
        assert list(db.scan()) == []
    # abort() deletes what tasks that finished reported; a task still running when the job
    # failed reports nothing, and its SSTs are orphans for GC (which needs them gc_min_age
    # old: its clock is moved past that). Such a task may still be finishing its PUT.
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    deadline = time.monotonic() + 30
    while compacted_objects(url) and time.monotonic() < deadline:
        GarbageCollector(open_store(url), settings=OFF, clock=lambda: later).collect()
        time.sleep(0.2)
    assert compacted_objects(url) == []


def test_bad_options_fail_before_any_object_is_written(spark: Any, tmp_path: Path) -> None:
    url = new_db(tmp_path)
    df = spark.createDataFrame([(1, "a", 1.0)], SCHEMA)
    cases: list[tuple[dict[str, str], str]] = [
        ({"key": "nope"}, "option 'key': no column 'nope'"),
        ({"key": "score"}, "option 'key': column 'score' is of type double"),
        ({"value": "name"}, "option 'value'"),
        ({"colour": "red"}, "unknown option"),
    ]
    for options, message in cases:
        writer = df.write.format("slatepy").option("url", url)
        for name, value in {"key": "id", **options}.items():
            writer = writer.option(name, value)
        with pytest.raises(Exception, match=message):
            writer.mode("append").save()
    with pytest.raises(Exception, match="option 'url' is required"):
        df.write.format("slatepy").option("key", "id").mode("append").save()
    with pytest.raises(Exception, match="option 'url': no slatepy database"):
        load(df, f"file://{tmp_path}/missing", createIfMissing="false")
    assert not (tmp_path / "missing").exists()
    arrays = spark.createDataFrame([(1, [1, 2])], "id long, xs array<int>")
    with pytest.raises(Exception, match="option 'value' not set, so column 'xs'"):
        load(arrays, url)
    with pytest.raises(Exception, match="only appends"):
        df.write.format("slatepy").option("url", url).option("key", "id").mode("overwrite").save()
    assert compacted_objects(url) == []


def test_a_load_creates_the_table_and_a_read_needs_no_schema(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "new-db")  # a plain path, and no database there yet
    df = spark.createDataFrame(
        [(i, f"n{i}", i / 4, i % 2 == 0) for i in range(100)],
        "id long, name string, score double, even boolean",
    )
    df.write.format("slatepy").option("key", "id").mode("append").save(path)
    back = spark.read.format("slatepy").load(path)  # no .schema(), no key option
    assert back.schema == df.schema
    assert sorted(back.collect()) == sorted(df.collect())
    narrow = spark.read.format("slatepy").schema("id long, score double").load(path)
    assert sorted(narrow.collect()) == sorted(df.select("id", "score").collect())  # it wins
    for ddl, message in [
        ("id string, name string", "column 'id' is string, but the database's recorded layout"),
        ("id long, score string", "column 'score' is string, but .* key \\(id long\\)"),
    ]:
        with pytest.raises(Exception, match=message):
            spark.read.format("slatepy").schema(ddl).load(path).collect()
    with pytest.raises(Exception, match="option 'key': columns \\['name'\\], but"):
        df.write.format("slatepy").option("key", "name").mode("append").save(path)


def test_a_key_type_that_does_not_match_the_stored_keys_names_them(
    spark: Any, tmp_path: Path
) -> None:
    url = new_db(tmp_path)
    with Db.open(url, settings=OFF) as db:  # integer keys, no recorded layout
        db.put(key(1), CODEC.encode_values({1: ["a"], 2: [1.0]}, 1)[0])
    read = spark.read.format("slatepy").schema("id string, name string").option("url", url)
    with pytest.raises(
        Exception, match=r"a stored key does not decode as key column\(s\) \(id string\)"
    ):
        read.option("key", "id").load().collect()


def test_a_task_over_its_buffer_budget_spills_sorted_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load task without Spark: rows past ``bufferBytes`` spill to sorted runs, equal
    keys across runs keep the last row, and traced memory does not grow with the rows."""
    import tracemalloc

    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from slatepy.spark.kv import KvWriter
    from slatepy.spark.spill import SortedSpill

    schema = StructType([StructField("id", LongType()), StructField("name", StringType())])
    spills: list[str] = []
    spill = SortedSpill._spill

    def counted(self: SortedSpill) -> None:
        spills.append("run")
        spill(self)

    monkeypatch.setattr(SortedSpill, "_spill", counted)

    def load(url: str, rows: int) -> int:
        options = {"url": url, "key": "id", "bufferBytes": "131072", "targetSstBytes": "131072"}
        writer = KvWriter(options, schema, overwrite=False)  # creates the database
        ids = [(i * 7919) % rows for i in range(rows)]  # every id once, shuffled ...
        batches = [
            pa.record_batch({"id": ids[i : i + 500], "name": [f"n{j}" for j in ids[i : i + 500]]})
            for i in range(0, rows, 500)
        ] + [pa.record_batch({"id": [0, rows - 1], "name": ["new", "new"]})]  # ... 2 again
        tracemalloc.start()
        try:
            message = writer.write(iter(batches))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        writer.commit([message])
        with Db.open(url, settings=OFF) as db:
            assert CODEC.decode_keys([k for k, _ in db.scan()])[0] == list(range(rows))
            names = [name_of(v) for v in db.get_many([key(0), key(1), key(rows - 1)])]
            assert names == ["new", "n1", "new"]
        return peak

    small = load(f"file://{tmp_path}/a", 10_000)
    assert len(spills) >= 4
    large = load(f"file://{tmp_path}/b", 40_000)  # ~35x the budget
    assert len(spills) >= 4 + 16
    assert large < 1.5 * small + (1 << 20), (small, large)
