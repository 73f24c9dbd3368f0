"""A commit that fails *after* its publish landed never loses data (RFC 0025).

Spark calls ``abort(messages)`` when ``commit(messages)`` raised or its Python worker died,
also after the manifest publish / shard append landed. The matrix: the KV bulk load, the
persist sink's one-off write and its stream, each with the commit raising and with the
commit's worker SIGKILLed after the publish (``tests/spark/failing.py``). Afterwards every
row is readable, nothing referenced was deleted, and a rerun (a restart from the checkpoint
for the stream) ends with every row exactly once.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from slatepy import Db, Settings
from slatepy.gc import GarbageCollector
from slatepy.persist import PersistClient
from slatepy.store import open_store
from tests.spark import failing

pytestmark = pytest.mark.spark

OFF = Settings(compactor="off")
SHARD = "events"
PAD = "x" * 120  # values long enough that a task's part is a blob, not inline in the state


@pytest.fixture(scope="module")
def spark_failing(spark: Any) -> Any:
    failing.register(spark)
    return spark


def shard_counts(url: str) -> tuple[collections.Counter[str], set[str]]:
    """The shard's consolidated ``key -> diff`` (values checked) and its trace's blob keys;
    reading fails if a part the shard references is missing."""
    with PersistClient.open(url) as client:
        state = client.machine(SHARD).fetch()
        blobs = {key for batch in state.trace for key in batch.part_keys()}
        if not state.upper:
            return collections.Counter(), blobs
        reader = client.open_leased_reader(SHARD)
        try:
            updates = reader.snapshot(state.upper - 1)
        finally:
            reader.expire()
    counts: collections.Counter[str] = collections.Counter()
    for (key, value), _, diff in updates:
        assert value == b"v" + key + PAD.encode(), (key, value)
        counts[key.decode()] += diff
    return counts, blobs


@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_kv_load_whose_commit_fails_after_the_publish(
    spark_failing: Any, tmp_path: Path, fault: str
) -> None:
    url = f"file://{tmp_path}/db"
    Db.open(url, settings=OFF).close()
    n = 2000
    df = spark_failing.range(n).selectExpr("id", "concat('name', id) AS name").repartition(2)

    def load(source: str, **extra: str) -> None:
        writer = df.write.format(source).option("url", url).option("key", "id")
        for name, value in extra.items():
            writer = writer.option(name, value)
        writer.mode("append").save()

    with pytest.raises(Exception, match=r"injected|Python worker|crash|EOF|exited"):
        load("failing.slatepy", fault=fault, targetSstBytes="4096")

    def rows() -> list[tuple[int, str]]:
        back = spark_failing.read.format("slatepy").schema("id long, name string")
        return sorted(
            tuple(r) for r in back.option("url", url).option("key", "id").load().collect()
        )

    expected = [(i, f"name{i}") for i in range(n)]
    assert rows() == expected  # the published SSTs are all there
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    GarbageCollector(open_store(url), settings=OFF, clock=lambda: later).collect()
    with Db.open(url, settings=OFF) as db:
        assert len(list(db.scan())) == n
    load("slatepy")  # the rerun: newest wins, every key once
    assert rows() == expected


@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_persist_write_whose_commit_fails_after_the_append(
    spark_failing: Any, tmp_path: Path, fault: str
) -> None:
    url = f"file://{tmp_path}/persist"
    keys = [f"k{i:04}" for i in range(400)]
    df = spark_failing.createDataFrame(
        [(k, "v" + k + PAD) for k in keys], "key string, value string"
    ).repartition(2)

    def save(source: str, **extra: str) -> None:
        writer = df.write.format(source).mode("append").option("url", url).option("shard", SHARD)
        for name, value in {"idempotencyKey": "job", "idempotencyId": "1", **extra}.items():
            writer = writer.option(name, value)
        writer.save()

    with pytest.raises(Exception, match=r"injected|Python worker|crash|EOF|exited"):
        save("failing.slatepy.persist", fault=fault)
    counts, blobs = shard_counts(url)
    assert counts == {k: 1 for k in keys} and blobs  # readable: no part deleted
    save("slatepy.persist")  # the retried job: appended once
    assert shard_counts(url)[0] == {k: 1 for k in keys}


def write_inputs(directory: Path, files: int, rows: int) -> list[str]:
    directory.mkdir(parents=True)
    keys = []
    for f in range(files):
        with open(directory / f"part-{f:03}.json", "w") as out:
            for r in range(rows):
                key = f"r{f:03}-{r:04}"
                keys.append(key)
                out.write(json.dumps({"key": key, "value": "v" + key + PAD}) + "\n")
    return keys


@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_stream_whose_commit_fails_after_the_append_restarts_exactly_once(
    spark_failing: Any, tmp_path: Path, fault: str
) -> None:
    url = f"file://{tmp_path}/persist"
    inputs, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    keys = write_inputs(inputs, files=3, rows=100)

    def run(source: str, **extra: str) -> Any:
        stream = (
            spark_failing.readStream.format("json")
            .schema("key string, value string")
            .option("maxFilesPerTrigger", 1)
            .load(str(inputs))
        )
        writer = (
            stream.writeStream.format(source)
            .option("url", url)
            .option("shard", SHARD)
            .option("checkpointLocation", str(checkpoint))
        )
        for name, value in extra.items():
            writer = writer.option(name, value)
        query = writer.trigger(availableNow=True).start()
        try:
            query.awaitTermination(240)
        except Exception as exc:  # StreamingQueryException: the query failed
            return exc
        return None

    assert run("failing.slatepy.persist", fault=fault) is not None  # batch 0's commit failed
    counts, blobs = shard_counts(url)
    assert sum(counts.values()) == 100 and set(counts.values()) == {1} and blobs
    assert not (checkpoint / "commits" / "0").exists()  # Spark did not record it
    assert run("slatepy.persist") is None  # replays batch 0 (appends nothing), then the rest
    assert shard_counts(url)[0] == {k: 1 for k in keys}
