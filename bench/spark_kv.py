"""The Spark KV source's bulk load and range read (RFC 0016), run by ``python -m bench.spark``.

Load: ``rows`` rows (key: the row number zero-padded to 10 digits, value: about 100 bytes,
both binary columns) from ``spark.range`` (two partitions of contiguous row numbers) written
by ``df.write.format("slatepy")`` in ``local[2]`` to a fresh ``file://`` database (created
with ``Db.open`` first), timed from ``save()`` to its return; once as is, once after
``repartitionByRange(2, "key")`` (a shuffle first). Beside it, the same rows written by one
process with ``Db.write`` in WriteBatches of ``write_batch`` rows (each awaited durable;
default settings: the in-process compactor runs and its requests are counted too) to another
fresh ``file://`` database, timed to the end of ``close()``, once per ``--write-batch`` size.
Both sides are also timed until compacted: a ``Compactor.run_until_idle`` after the load's
``save()`` / the writer's ``close()`` (its time added); the ratio compares those against the
better ``Db.write``.
A 1,000-row load into a throwaway database runs first, untimed (it starts the Python
workers).

Requests: the ``Db.write`` side counts every request through the database's
``MetricsStore``. The Spark tasks run in PySpark worker processes, whose stores this process
cannot count: the load side reports the objects (and bytes) the load added under the
database directory (listed before and after; on ``file://`` each is one PUT), which leaves
out its reads (manifest, LIST) and the manifest update's conditional PUT is counted as the
one new manifest object.

Read: ``spark.read.format("slatepy")`` of the loaded database, the full key range and a 1%
range (``start``/``end``), timed to the end of ``count()``; rows and partitions from the
query. Objects read: the reader's own code (``KvReader.partitions`` then ``read`` of every
partition, what the Spark tasks run) run once more in this process with ``open_stack``
replaced by a counting one: GET / ranged GET requests and the distinct objects they touched.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.store import ObjectStore, open_store
from slatepy.store.metrics import MetricsStore, StoreMetrics

RESULTS = Path(__file__).parent / "results"
VALUE_PAD = 90


def key_of(i: int) -> bytes:
    return b"%010d" % i


def value_of(i: int) -> bytes:
    return b"v%d" % i + b"x" * VALUE_PAD


class PathCountingStore(MetricsStore):
    """A ``MetricsStore`` that also remembers which objects were read."""

    def __init__(self, inner: ObjectStore, metrics: StoreMetrics, paths: set[str]) -> None:
        super().__init__(inner, metrics)
        self.paths = paths

    def get(self, path: str) -> bytes:
        self.paths.add(path)
        return super().get(path)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        self.paths.add(path)
        return super().get_range(path, start, end)

    def get_ranges(self, path: str, ranges: Any) -> list[bytes]:
        self.paths.add(path)
        return super().get_ranges(path, ranges)


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def compact(url: str) -> float:
    """Seconds a compactor takes to compact everything left in L0 (the end of 'compacted')."""
    started = time.perf_counter()
    Compactor(open_store(url)).run_until_idle()
    return time.perf_counter() - started


def db_write(url: str, rows: int, batch_rows: int) -> dict[str, Any]:
    db = Db.open(url)  # default settings: its in-process compactor keeps the writer unstalled
    db.metrics.reset()
    started = time.perf_counter()
    for lo in range(0, rows, batch_rows):
        batch = WriteBatch()
        for i in range(lo, min(lo + batch_rows, rows)):
            batch.put(key_of(i), value_of(i))
        db.write(batch)  # awaited durable
    db.close()
    seconds = time.perf_counter() - started
    compacted = seconds + compact(url)
    ops = {k: v.requests for k, v in db.metrics.snapshot().items() if v.requests}
    total = sum(ops.values())
    return {
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows / seconds),
        "seconds_compacted": round(compacted, 2),
        "rows_per_s_compacted": round(rows / compacted),
        "requests": ops,
        "requests_per_1000_rows": round(total * 1000 / rows, 2),
    }


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _ours(pid: int) -> bool:
    """Whether ``pid`` descends from this process (other users' Spark workers are not)."""
    me = os.getpid()
    for _ in range(64):
        pid = _parent(pid)
        if pid in (0, 1):
            return False
        if pid == me:
            return True
    return False


class PeakWorkerRss(threading.Thread):
    """The largest RSS (MB) of any of our PySpark Python workers, sampled every 50 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        from bench.spark import rss_mb, worker_pids

        while not self.stop.wait(0.05):
            ours = [pid for pid in worker_pids() if _ours(pid)]
            self.peak = max([self.peak, *(rss_mb(pid) for pid in ours)])


def spark_load(spark: Any, root: Path, rows: int, *, by_range: bool) -> dict[str, Any]:
    url = f"file://{root}"
    Db.open(url, settings=Settings.from_dict({"compactor": "off"})).close()
    before = tree(root)
    df = spark.range(0, rows, numPartitions=2).selectExpr(
        "cast(lpad(cast(id as string), 10, '0') as binary) as key",
        f"cast(concat('v', cast(id as string), repeat('x', {VALUE_PAD})) as binary) as value",
    )
    if by_range:
        df = df.repartitionByRange(2, "key")
    writer = df.write.format("slatepy").option("url", url).option("key", "key")
    writer = writer.option("value", "value").mode("append")
    sampler = PeakWorkerRss()
    sampler.start()
    started = time.perf_counter()
    writer.save()  # published: durable and visible
    seconds = time.perf_counter() - started
    sampler.stop.set()
    sampler.join()
    after = tree(root)
    added = {p: size for p, size in after.items() if before.get(p) != size}
    compacted = seconds + compact(url)
    return {
        "seconds": round(seconds, 2),
        "rows_per_s": round(rows / seconds),
        "seconds_compacted": round(compacted, 2),
        "rows_per_s_compacted": round(rows / compacted),
        "peak_worker_rss_mb": round(sampler.peak),
        "objects_added": len(added),
        "objects_added_per_1000_rows": round(len(added) * 1000 / rows, 3),
        "bytes_added": sum(added.values()),
    }


def counted_read(url: str, start: str | None, end: str | None) -> dict[str, Any]:
    """Run the KV reader's partitions and reads in this process, counting requests."""
    from pyspark.sql.types import StructType

    from slatepy.spark import kv

    options = {"url": url}
    if start is not None:
        options["start"] = start
    if end is not None:
        options["end"] = end
    metrics = StoreMetrics()
    paths: set[str] = set()
    real = kv.open_stack

    def counting(target: Any, settings: Settings) -> MetricsStore:
        return PathCountingStore(real(target, settings), metrics, paths)

    schema = StructType.fromDDL(kv.DEFAULT_SCHEMA)
    rows = 0
    with mock.patch.object(kv, "open_stack", counting):
        reader = kv.KvReader(options, schema)
        parts = reader.partitions()
        for part in parts:
            for batch in reader.read(part):
                rows += batch.num_rows
    ops = {k: v.requests for k, v in metrics.snapshot().items() if v.requests}
    reads = {k: v for k, v in ops.items() if k.startswith("get")}
    return {
        "rows": rows,
        "partitions": len(parts),
        "requests": ops,
        "get_requests": sum(reads.values()),
        "objects_read": len(paths),
        "sst_objects_read": len([p for p in paths if p.endswith(".sst")]),
    }


def spark_read(spark: Any, url: str, start: str | None, end: str | None) -> dict[str, Any]:
    reader = spark.read.format("slatepy").option("url", url)
    if start is not None:
        reader = reader.option("start", start)
    if end is not None:
        reader = reader.option("end", end)
    started = time.perf_counter()
    df = reader.load()
    count = df.count()
    seconds = time.perf_counter() - started
    return {
        "seconds": round(seconds, 2),
        "rows": count,
        "partitions": df.rdd.getNumPartitions(),
        **{f"counted_{k}": v for k, v in counted_read(url, start, end).items()},
    }


def run_kv(spark: Any, rows: int, write_batches: list[int], only: set[str]) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-spark-kv-"))
    results: dict[str, Any] = {"rows": rows, "write_batches": write_batches, "store": "file"}
    loaded = work / "spark"
    # Warm-up (not timed): the first Python data source job starts the Python workers.
    spark_load(spark, work / "warmup", 1000, by_range=False)
    if "load" in only:
        results["db_write"] = {
            str(n): db_write(f"file://{work}/dbwrite-{n}", rows, n) for n in write_batches
        }
        results["spark_load"] = spark_load(spark, loaded, rows, by_range=False)
        results["spark_load_range"] = spark_load(spark, work / "spark-range", rows, by_range=True)
        # Against the better Db.write, both sides timed until compacted (and durable).
        base = max(w["rows_per_s_compacted"] for w in results["db_write"].values())
        results["ratio"] = round(results["spark_load"]["rows_per_s_compacted"] / base, 2)
        results["ratio_range"] = round(
            results["spark_load_range"]["rows_per_s_compacted"] / base, 2
        )
        results["target_met"] = results["ratio"] >= 2
    if "read" in only:
        if not loaded.exists():
            spark_load(spark, loaded, rows, by_range=False)
        lo, hi = rows * 49 // 100, rows * 50 // 100
        start, end = key_of(lo).decode(), key_of(hi).decode()
        results["read_range"] = {"start": start, "end": end}
        results["read_1pct"] = spark_read(spark, f"file://{loaded}", start, end)
        results["read_full"] = spark_read(spark, f"file://{loaded}", None, None)
    print(json.dumps(results, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "spark-kv.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "spark-kv.md").write_text(markdown(results))
    return results


def markdown(r: dict[str, Any]) -> str:
    md = [f"# bench.spark: KV bulk load and read, {r['rows']:,} rows on file://", ""]
    if "db_write" in r:
        s, g = r["spark_load"], r["spark_load_range"]
        md += [
            "| writer | s durable | rows/s durable | s compacted | rows/s compacted | "
            "requests / 1,000 rows | peak worker RSS (MB) |",
            "|---|---|---|---|---|---|---|",
        ]
        for n, w in r["db_write"].items():
            md.append(
                f"| Db.write, batches of {int(n):,}, one process | {w['seconds']} | "
                f"{w['rows_per_s']:,} | {w['seconds_compacted']} | "
                f"{w['rows_per_s_compacted']:,} | {w['requests_per_1000_rows']} (counted) | - |"
            )
        for name, x in (("Spark local[2] bulk load", s), ("Spark, repartitionByRange", g)):
            md.append(
                f"| {name} | {x['seconds']} | {x['rows_per_s']:,} | {x['seconds_compacted']} | "
                f"{x['rows_per_s_compacted']:,} | {x['objects_added_per_1000_rows']} "
                f"(objects added by the load) | {x['peak_worker_rss_mb']} |"
            )
        md += [
            "",
            f"Spark / the better Db.write, both until compacted: {r['ratio']}x without, "
            f"{r['ratio_range']}x with repartitionByRange (target >= 2x: "
            f"{'met' if r['target_met'] else 'NOT met'}).",
            "",
        ]
    if "read_1pct" in r:
        md += [
            "| read | s | rows | partitions | GET requests | objects read (SSTs) |",
            "|---|---|---|---|---|---|",
        ]
        for name, key in (("1% range", "read_1pct"), ("full", "read_full")):
            x = r[key]
            md.append(
                f"| {name} | {x['seconds']} | {x['rows']:,} | {x['partitions']} | "
                f"{x['counted_get_requests']} | {x['counted_objects_read']} "
                f"({x['counted_sst_objects_read']}) |"
            )
        md.append("")
    return "\n".join(md)
