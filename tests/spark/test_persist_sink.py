"""The ``slatepy.persist`` sink (RFC 0016, "Persist sink"): options checked before anything
is written, one-off appends (idempotent with a key), streams into a shard exactly once
across a driver killed mid-stream and inside ``commit``, and two queries contending for
one shard."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slatepy.errors import InvalidArgument
from slatepy.persist import PersistClient
from slatepy.spark.persist_sink import sink_config

pytestmark = pytest.mark.spark

SHARD = "events"
DRIVER = Path(__file__).with_name("persist_sink_driver.py")


def shard_rows(url: str, shard: str = SHARD) -> tuple[collections.Counter[bytes], int | None]:
    """The shard's consolidated contents as ``key -> diff`` (values checked to be the key's
    ``v`` form), and its upper."""
    with PersistClient.open(url) as client:
        write = client.open_writer(shard)
        upper = write.fetch_recent_upper()
        if not upper:
            return collections.Counter(), upper
        reader = client.open_leased_reader(shard)
        try:
            updates = reader.snapshot(upper - 1)
        finally:
            reader.expire()
    counts: collections.Counter[bytes] = collections.Counter()
    for (key, value), _, diff in updates:
        assert value == b"v" + key, (key, value)
        counts[key] += diff
    return counts, upper


def write_inputs(directory: Path, files: int, rows: int, prefix: str) -> list[bytes]:
    directory.mkdir(parents=True)
    keys = []
    for f in range(files):
        with open(directory / f"part-{f:03}.json", "w") as out:
            for r in range(rows):
                key = f"{prefix}{f:03}-{r:04}"
                keys.append(key.encode())
                out.write(json.dumps({"key": key, "value": "v" + key}) + "\n")
    return keys


# --- options, no Spark job -------------------------------------------------------------


def schema(ddl: str) -> Any:
    """A StructType from ``"name type, ..."`` without a session (simple types only)."""
    from pyspark.sql import types

    kinds = {
        "binary": types.BinaryType(),
        "string": types.StringType(),
        "int": types.IntegerType(),
        "long": types.LongType(),
    }
    fields = [item.split() for item in ddl.split(",")]
    return types.StructType([types.StructField(name, kinds[kind]) for name, kind in fields])


@pytest.mark.parametrize(
    ("options", "ddl", "named"),
    [
        ({"shard": SHARD}, "key binary, value binary", '"url"'),
        ({"url": "memory://"}, "key binary, value binary", '"shard"'),
        ({"url": "memory://", "shard": SHARD, "shrad": "x"}, "key string, value string", "shrad"),
        ({"url": "memory://", "shard": "a/b"}, "key string, value string", '"shard"'),
        ({"url": "memory://", "shard": SHARD}, "k string, value string", '"key"'),
        ({"url": "memory://", "shard": SHARD}, "key int, value string", '"key"'),
        ({"url": "memory://", "shard": SHARD}, "key string, value string, x int", "'x'"),
        (
            {"url": "memory://", "shard": SHARD, "timeColumn": "t"},
            "key string, value string",
            '"timeColumn"',
        ),
        (
            {"url": "memory://", "shard": SHARD, "timeColumn": "t"},
            "key string, value string, t string",
            '"timeColumn"',
        ),
        (
            {"url": "memory://", "shard": SHARD, "idempotencyKey": "job"},
            "key string, value string",
            '"idempotencyId"',
        ),
    ],
)
def test_bad_options_and_columns_name_the_problem(
    options: dict[str, str], ddl: str, named: str
) -> None:
    pytest.importorskip("pyspark")
    with pytest.raises(InvalidArgument, match=named):
        sink_config(options, schema(ddl), stream=False)


def test_stream_options_allow_the_checkpoint_and_keys_are_namespaced() -> None:
    pytest.importorskip("pyspark")
    opts = {"URL": "memory://", "Shard": SHARD, "checkpointlocation": "/c", "queryname": "q"}
    config = sink_config(opts, schema("key binary, value binary, diff int"), stream=True)
    assert (config.shard, config.has_diff, config.time_column) == (SHARD, True, None)
    opts = {"url": "memory://", "shard": SHARD, "idempotencyKey": "j", "idempotencyId": "3"}
    assert sink_config(opts, schema("key binary, value binary"), stream=False).idempotency == (
        "user:j",
        3,
    )


# --- with Spark -------------------------------------------------------------------------


def test_a_bad_write_fails_before_any_object_is_written(spark: Any, tmp_path: Path) -> None:
    target = tmp_path / "persist"
    df = spark.createDataFrame([("a", "va")], "key string, value string")
    with pytest.raises(Exception, match="shard"):
        df.write.format("slatepy.persist").mode("append").option("url", f"file://{target}").save()
    with pytest.raises(Exception, match="bogus"):
        (
            df.write.format("slatepy.persist")
            .mode("append")
            .option("url", f"file://{target}")
            .option("shard", SHARD)
            .option("bogus", "1")
            .save()
        )
    assert not target.exists() or not any(target.rglob("*"))


def test_one_off_appends_and_an_idempotent_retry(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/persist"
    rows = [(f"k{i}", f"vk{i}", i % 3) for i in range(50)]
    df = spark.createDataFrame(rows, "key string, value string, t long").repartition(2)

    def save(**extra: str) -> None:
        writer = (
            df.write.format("slatepy.persist")
            .mode("append")
            .option("url", url)
            .option("shard", SHARD)
            .option("timeColumn", "t")
        )
        for name, value in extra.items():
            writer = writer.option(name, value)
        writer.save()

    save()
    counts, upper = shard_rows(url)
    assert upper == 3 and counts == {f"k{i}".encode(): 1 for i in range(50)}
    save(idempotencyKey="job-7", idempotencyId="1")
    save(idempotencyKey="job-7", idempotencyId="1")  # the retried job: appended once
    counts, _ = shard_rows(url)
    assert counts == {f"k{i}".encode(): 2 for i in range(50)}


def test_two_queries_contend_for_one_shard_exactly_once(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/persist"
    expected: list[bytes] = []
    queries = []
    for name in ("a", "b"):
        expected += write_inputs(tmp_path / f"in-{name}", files=4, rows=25, prefix=name)
        stream = (
            spark.readStream.format("json")
            .schema("key string, value string")
            .option("maxFilesPerTrigger", 1)
            .load(str(tmp_path / f"in-{name}"))
        )
        queries.append(
            stream.writeStream.format("slatepy.persist")
            .option("url", url)
            .option("shard", SHARD)
            .option("checkpointLocation", str(tmp_path / f"ckpt-{name}"))
            .trigger(availableNow=True)
            .start()
        )
    for query in queries:
        query.awaitTermination(240)
        assert query.exception() is None
    counts, upper = shard_rows(url)
    assert counts == {key: 1 for key in expected}
    # Eight micro-batches, each one append; neither query's batch ids 0..3 alone.
    assert upper is not None and upper >= 8
    with PersistClient.open(url) as client:
        keys = client.machine(SHARD).fetch().idempotency
    assert len(keys) == 2 and sorted(a.id for a in keys.values()) == [3, 3]

    # Run a third query over a new checkpoint only after the others finished: every mint
    # starts above its batch ids, so all its batches land forwarded.
    expected += write_inputs(tmp_path / "in-c", files=2, rows=10, prefix="c")
    stream = (
        spark.readStream.format("json")
        .schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .load(str(tmp_path / "in-c"))
    )
    query = (
        stream.writeStream.format("slatepy.persist")
        .option("url", url)
        .option("shard", SHARD)
        .option("checkpointLocation", str(tmp_path / "ckpt-c"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    counts, after = shard_rows(url)
    assert counts == {key: 1 for key in expected}
    assert after == upper + 2


def _driver(
    url: str, inputs: Path, checkpoint: Path, env: dict[str, str], *marker: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(DRIVER), url, SHARD, str(inputs), str(checkpoint), *marker],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the kill takes JVM and workers
    )


def test_a_driver_killed_inside_commit_and_mid_stream_ends_exactly_once(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    url = f"file://{tmp_path}/persist"
    inputs, checkpoint, marker = tmp_path / "in", tmp_path / "ckpt", tmp_path / "killed"
    expected = write_inputs(inputs, files=6, rows=40, prefix="r")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    # 1. Killed inside commit (tests/spark/failing.py): after the append, before Spark's
    # commit log.
    first = _driver(url, inputs, checkpoint, env, str(marker))
    out, _ = first.communicate(timeout=240)
    assert first.returncode == -signal.SIGKILL, out
    assert marker.exists()
    counts, upper = shard_rows(url)
    assert upper == 1 and sum(counts.values()) == 40  # batch 0 appended ...
    assert not (checkpoint / "commits" / "0").exists()  # ... and not recorded by Spark

    # 2. Restarted, then SIGKILLed from outside once it appended more (mid-stream).
    second = _driver(url, inputs, checkpoint, env)
    deadline = time.monotonic() + 240
    while shard_rows(url)[1] in (None, 1) and second.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):  # (it may, rarely, have finished)
        os.killpg(second.pid, signal.SIGKILL)
    second.communicate(timeout=60)
    counts, upper = shard_rows(url)
    assert all(n == 1 for n in counts.values()), counts

    # 3. Restarted again: runs to the end.
    third = _driver(url, inputs, checkpoint, env)
    out, _ = third.communicate(timeout=240)
    assert third.returncode == 0 and "DONE" in out, out
    counts, upper = shard_rows(url)
    assert counts == {key: 1 for key in expected}
    # Batch i appended at [i, i + 1), the replay of 0 appending nothing. Usually 6 batches,
    # one file each; a restart may plan the files left differently, so count Spark's commits.
    commits = [int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    assert upper == max(commits) + 1 <= 6


def test_a_replayed_append_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("pyspark")
    import pyarrow as pa

    from slatepy.spark.persist_sink import commit_batches, write_task

    url = f"file://{tmp_path}/persist"
    config = sink_config(
        {"url": url, "shard": SHARD}, schema("key binary, value binary"), stream=True
    )
    rows = pa.record_batch({"key": [b"a", b"b"], "value": [b"va", b"vb"]})

    def commit() -> bool:
        message = write_task(config, iter([rows]), 0, "q")
        return commit_batches(config, [message], idempotency=("spark:q", 0), min_time=0)

    assert commit()
    with caplog.at_level("WARNING", logger="slatepy.spark"):
        assert not commit()  # the replay of batch 0
    assert "key 'spark:q' is recorded at id 0, this append's id is 0; 2 row(s)" in caplog.text
    assert shard_rows(url)[0] == {b"a": 1, b"b": 1}


def test_a_writer_id_reused_on_a_new_checkpoint_is_refused(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/persist"

    def run(name: str, writer_id: str) -> Exception | None:
        stream = (
            spark.readStream.format("json")
            .schema("key string, value string")
            .option("maxFilesPerTrigger", 1)
            .load(str(tmp_path / f"in-{name}"))
        )
        query = (
            stream.writeStream.format("slatepy.persist")
            .option("url", url)
            .option("shard", SHARD)
            .option("writerId", writer_id)
            .option("checkpointLocation", str(tmp_path / f"ckpt-{name}"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(240)
        except Exception as exc:  # StreamingQueryException
            return exc
        return None

    first = write_inputs(tmp_path / "in-a", files=1, rows=10, prefix="a")
    assert run("a", "orders") is None
    second = write_inputs(tmp_path / "in-b", files=1, rows=10, prefix="b")
    failed = run("b", "orders")  # a new checkpoint: its batch 0 is not the old query's
    assert failed is not None and "option \"writerId\" 'orders' was used by another" in str(failed)
    assert shard_rows(url)[0] == {key: 1 for key in first}  # refused, nothing appended
    assert run("b", "orders-2") is None  # not silently lost: a new writerId appends it all
    assert shard_rows(url)[0] == {key: 1 for key in first + second}


def test_merges_that_outlast_the_commit_wait_keep_the_trace_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Micro-batch commits (``commit_batches``, no Spark) whose merges take longer than the
    commit's wait (merges read their parts slowly and check for a stop every 8 entries),
    for more than 3 x ``merge_lease``: the trace stays bounded (before: every commit
    abandoned its merge when its client closed, and the trace grew by one per commit)."""
    pytest.importorskip("pyspark")
    import threading

    import pyarrow as pa

    from slatepy.persist import PersistSettings, compactor
    from slatepy.spark import persist_sink
    from slatepy.store import open_store
    from slatepy.store.base import WrappingStore

    class SlowMergeReads(WrappingStore):
        def _slow(self, path: str) -> None:
            if "/part/" in path and threading.current_thread().name.endswith("maintenance"):
                time.sleep(0.03)

        def get(self, path: str) -> bytes:
            self._slow(path)
            return self.inner.get(path)

        def get_range(self, path: str, start: int, end: int) -> bytes:
            self._slow(path)
            return self.inner.get_range(path, start, end)

    url = f"file://{tmp_path}/persist"
    settings = PersistSettings(
        merge_lease=1.0, batch_lease=60.0, allow_short_leases=True, inline_part_max_bytes=0
    )

    def open_client(config: Any) -> PersistClient:
        return PersistClient.open(SlowMergeReads(open_store(url, create=True)), settings=settings)

    monkeypatch.setattr(compactor, "CHECK_EVERY", 8)
    monkeypatch.setattr(persist_sink, "_open", open_client)
    monkeypatch.setattr(persist_sink, "MAINTENANCE_WAIT", 0.05)
    monkeypatch.setattr(persist_sink, "TRACE_BOUND", 6, raising=False)
    config = sink_config(
        {"url": url, "shard": SHARD}, schema("key binary, value binary"), stream=True
    )
    longest, n, start = 0, 0, time.monotonic()
    while time.monotonic() - start < 3.5 * settings.merge_lease or n < 30:
        keys = [f"b{n:03}-{i:03}".encode() for i in range(20)]
        rows = pa.record_batch({"key": keys, "value": [b"v" + k for k in keys]})
        message = persist_sink.write_task(config, iter([rows]), n, "q")
        assert persist_sink.commit_batches(
            config, [message], idempotency=("spark:q", n), min_time=n
        )
        with open_client(config) as client:
            longest = max(longest, len(client.machine(SHARD).fetch().trace))
        n += 1
    # The spine claims a merge at 8 batches; merges behind by up to a merge_lease of
    # commits. Before: one batch more per commit (34 after 34 commits here).
    assert longest <= 16, (longest, n)
    counts, upper = shard_rows(url)
    assert upper == n and len(counts) == 20 * n and set(counts.values()) == {1}


def test_the_key_and_value_options_encode_rows_as_the_kv_source_does(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    import pyarrow as pa

    from slatepy.spark.codec import Column, RowCodec
    from slatepy.spark.persist_sink import commit_batches, write_task

    url = tmp_path / "persist"  # a plain path works as the url
    ddl = "id long, name string, t long"
    config = sink_config(
        {"url": str(url), "shard": SHARD, "key": "id", "timeColumn": "t"}, schema(ddl), stream=False
    )
    rows = pa.record_batch({"id": [2, 1], "name": ["b", "a"], "t": [0, 1]})
    commit_batches(
        config, [write_task(config, iter([rows]), 0, None)], idempotency=None, min_time=0
    )
    codec = RowCodec.of([Column("id", "long"), Column("name", "string")], ["id"], None)
    with PersistClient.open(f"file://{url}") as client:
        reader = client.open_leased_reader(SHARD)
        updates = sorted(reader.snapshot(1))
        reader.expire()
    keys = codec.decode_keys([k for (k, _), _, _ in updates])[0]
    names = codec.decode_values([v for (_, v), _, _ in updates])[1]
    assert list(zip(keys, names, strict=True)) == [(1, "a"), (2, "b")]
    with pytest.raises(InvalidArgument, match="option 'key': no column 'nope'"):
        sink_config({"url": "memory://", "shard": SHARD, "key": "nope"}, schema(ddl), stream=False)
