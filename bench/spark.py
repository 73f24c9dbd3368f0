"""Spark benchmarks (RFC 0016): the persist sink, and the KV bulk load and range read.

    python -m bench.spark [--only sink,load,read] [--rows 5000000] [--batch-rows 500000]
                          [--name spark] [--kv-rows 2000000] [--write-batch 1000]

``--only`` picks the sub-benchmarks (all by default), in one ``local[2]`` session. ``load``
and ``read`` are ``bench/spark_kv.py`` (its docstring says what they time and count; results
in ``bench/results/spark-kv.json`` and ``.md``). ``sink``:

A local session (``local[2]``) streams ``--rows`` rows from the ``rate-micro-batch`` source
(``--batch-rows`` per micro-batch, two partitions; key: the row number as a string, value:
about 100 bytes) into a persist shard on a ``file://`` directory through the
``slatepy.persist`` sink. Reported: rows/s over the micro-batches (sum of their trigger
durations) and, per micro-batch, the largest RSS of any PySpark Python worker sampled every
50 ms (``/proc``: processes running ``pyspark.daemon`` or ``pyspark.worker``). Target:
the last micro-batch's worker RSS within 1.5x of the first's (a task's memory is bounded by
the batch builder's buffer, not by the rows it writes). Writes ``bench/results/<name>.json``
and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def worker_pids() -> list[int]:
    """PySpark Python workers (and their daemon) on this machine started by this process
    tree."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline:
            pids.append(int(entry))
    return pids


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Sampler(threading.Thread):
    """Largest worker RSS per micro-batch (the index is the number of finished batches)."""

    def __init__(self, query: Any) -> None:
        super().__init__(daemon=True)
        self.query = query
        self.peaks: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            done = len(self.query.recentProgress)
            peak = max((rss_mb(pid) for pid in worker_pids()), default=0.0)
            self.peaks[done] = max(self.peaks.get(done, 0.0), peak)


def session() -> Any:
    from slatepy.spark.session import local_session

    return local_session("slatepy-bench-spark")


def run_sink(spark: Any, args: argparse.Namespace) -> None:
    from slatepy.persist import PersistClient

    batches = args.rows // args.batch_rows
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    url = f"file://{work}/persist"
    rows = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", args.batch_rows)
        .option("numPartitions", 2)
        .load()
        .selectExpr(
            "cast(cast(value as string) as binary) as key",
            "cast(concat('v', cast(value as string), repeat('x', 90)) as binary) as value",
        )
    )
    query = (
        rows.writeStream.format("slatepy.persist")
        .option("url", url)
        .option("shard", "bench")
        .option("checkpointLocation", str(work / "ckpt"))
        .start()
    )
    sampler = Sampler(query)
    sampler.start()
    try:
        while len([p for p in query.recentProgress if p["numInputRows"]]) < batches:
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.2)
    finally:
        sampler.stop.set()
        query.stop()
    progress = [p for p in query.recentProgress if p["numInputRows"]][:batches]
    seconds = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    sunk = sum(p["numInputRows"] for p in progress)
    with PersistClient.open(url) as client:
        upper = client.machine("bench").fetch().upper
    peaks = [round(sampler.peaks.get(i, 0.0), 1) for i in range(batches)]
    first, last = peaks[0], peaks[-1]
    results = {
        "rows": sunk,
        "batch_rows": args.batch_rows,
        "seconds": round(seconds, 2),
        "rows_per_s": round(sunk / seconds),
        "per_batch_s": [p["durationMs"]["triggerExecution"] / 1000 for p in progress],
        "worker_rss_mb_per_batch": peaks,
        "rss_last_over_first": round(last / first, 2) if first else None,
        "shard_upper": upper,
        "target_met": bool(first and last <= 1.5 * first),
    }
    print(json.dumps(results, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=2))
    md = [
        f"# bench.spark: persist sink, {sunk:,} rows in micro-batches of {args.batch_rows:,}",
        "",
        f"- rows/s: {results['rows_per_s']:,} ({results['seconds']} s over the micro-batches)",
        f"- worker RSS per micro-batch (MB): {peaks}",
        f"- last / first: {results['rss_last_over_first']} (target <= 1.5: "
        f"{'met' if results['target_met'] else 'NOT met'})",
        "",
    ]
    (RESULTS / f"{args.name}.md").write_text("\n".join(md))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="sink,load,read", help="comma-separated subset")
    parser.add_argument("--rows", type=int, default=5_000_000, help="sink rows")
    parser.add_argument("--batch-rows", type=int, default=500_000)
    parser.add_argument("--name", default="spark")
    parser.add_argument("--kv-rows", type=int, default=2_000_000, help="load/read rows")
    parser.add_argument(
        "--write-batch", default="1000,10000", help="Db.write batch rows (comma-separated)"
    )
    args = parser.parse_args()
    only = {part.strip() for part in args.only.split(",") if part.strip()}
    unknown = only - {"sink", "load", "read"}
    if unknown:
        raise SystemExit(f"unknown --only {sorted(unknown)} (sink, load, read)")
    spark = session()
    try:
        if "sink" in only:
            run_sink(spark, args)
        if only & {"load", "read"}:
            from bench.spark_kv import run_kv

            batches = [int(n) for n in args.write_batch.split(",") if n.strip()]
            run_kv(spark, args.kv_rows, batches, only)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
