"""``slatepy ingest``: run a source into persist shards until stopped (RFC 0027 §7).

``slatepy ingest postgresql://USER@HOST:PORT/DB --publication P --into URL --shard S`` ingests
every table of the publication: a one-table publication into the data shard ``S``, several
into ``S.<schema>.<table>`` each; the remap shard is ``S.remap`` and the replication slot
``slatepy_<S>`` (``--slot`` to choose). ``slatepy ingest loadgen --partitions N --rate R
--into URL --shard S`` ingests the load generator. Both resume where the shards say after any
kill, print a progress line at most every ``--report-interval`` seconds, stop cleanly on
SIGINT/SIGTERM (exit 0) and exit 1 with a one-line cause on a definite error.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
from typing import Any

from slatepy.cli.ingest_catalog import register_ingest
from slatepy.config import Settings
from slatepy.errors import SlatepyError
from slatepy.persist import PersistClient
from slatepy.sources import Ingest, LoadGen, Source, Stats, data_shards_of, remap_shard_of


def add_parser(sub: Any) -> None:
    """Register ``ingest`` on the ``slatepy`` command's subparsers."""
    ingest = sub.add_parser(
        "ingest", help="ingest PostgreSQL (logical replication) or the load generator"
    )
    ingest.add_argument("source", help="postgresql://USER@HOST:PORT/DB, or `loadgen`")
    ingest.add_argument("--into", required=True, help="the persist blob store URL")
    ingest.add_argument(
        "--shard",
        required=True,
        help="the data shard (S.<schema>.<table> for each table of a multi-table publication)",
    )
    ingest.add_argument("--consensus", default=None, help="persist consensus URL (default: blob)")
    ingest.add_argument("--publication", help="PostgreSQL: the publication to ingest")
    ingest.add_argument("--slot", help="PostgreSQL: the replication slot (default slatepy_S)")
    ingest.add_argument("--partitions", type=int, default=4, help="loadgen: partitions")
    ingest.add_argument("--rate", type=float, default=1000.0, help="loadgen: events per second")
    ingest.add_argument(
        "--report-interval", type=float, default=5.0, help="seconds between progress lines"
    )
    ingest.add_argument(
        "--spark",
        action="store_true",
        help="run on Spark: slatepy.loadgen / slatepy.postgres into slatepy.persist",
    )
    ingest.add_argument("--master", default="local[2]", help="with --spark: the Spark master")
    ingest.add_argument(
        "--checkpoint", default=None, help="with --spark: checkpoint dir (default under --into)"
    )
    ingest.add_argument(
        "--catalog", default=None, help="record the source and its shards in this catalog URL"
    )


def _source(args: argparse.Namespace) -> Source:
    if args.source == "loadgen":
        return LoadGen(args.partitions, args.rate)
    if args.source.startswith(("postgresql://", "postgres://")):
        if not args.publication:
            raise SlatepyError("a PostgreSQL source needs --publication")
        from slatepy.sources.postgres import PostgresSource, slot_name_of

        return PostgresSource(
            args.source, args.publication, slot=args.slot or slot_name_of(args.shard)
        )
    raise SlatepyError(f"unknown source {args.source!r}: a postgresql:// URL or `loadgen`")


def _offsets(source: Source, offsets: tuple[int, ...]) -> str:
    if source.partitions == 1 and not isinstance(source, LoadGen):
        from slatepy.sources.postgres import format_lsn

        return f"LSN {format_lsn(offsets[0])}"
    return "offsets " + ",".join(str(o) for o in offsets)


class _Reporter:
    def __init__(self, source: Source, shard: str) -> None:
        self.source, self.shard = source, shard
        self.last = (time.monotonic(), 0)

    def __call__(self, stats: Stats) -> None:
        now = time.monotonic()
        then, rows = self.last
        rate = (stats.rows - rows) / max(now - then, 1e-9)
        self.last = (now, stats.rows)
        lag = "" if stats.lag is None else f", lag {stats.lag}"
        print(
            f"ingest {self.shard}: {stats.rows} updates ({rate:.0f}/s), read "
            f"{_offsets(self.source, stats.offsets)}, committed "
            f"{_offsets(self.source, stats.committed)}, resumption time {stats.resumption} "
            f"(data upper {min(stats.data_uppers)}, remap upper {stats.remap_upper}){lag}",
            flush=True,
        )


def run(args: argparse.Namespace, settings: Settings) -> int:
    """``slatepy ingest``; returns the exit status."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if args.spark:
        try:
            if args.catalog:  # the source and its shards, before Spark starts (the sink too)
                register_ingest(args, _source(args), settings)
        except SlatepyError as exc:
            print(f"slatepy ingest: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        return run_spark(args, stop)
    try:
        source = _source(args)
        if args.catalog:  # before anything is written: a bad catalog fails with nothing done
            register_ingest(args, source, settings)
        with PersistClient.open(args.into, consensus=args.consensus, settings=settings) as client:
            ingest = Ingest(
                client,
                source,
                data_shards=data_shards_of(args.shard, source.outputs),
                remap_shard=remap_shard_of(args.shard),
            )
            ingest.run(
                stop,
                report=_Reporter(source, args.shard),
                report_interval=max(0.5, args.report_interval),
            )
    except SlatepyError as exc:
        print(f"slatepy ingest: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"ingest {args.shard}: stopped", flush=True)
    return 0


def _error_names(kind: type[SlatepyError] = SlatepyError) -> set[str]:
    """The names of ``kind`` and of every error class derived from it."""
    return {kind.__name__}.union(*map(_error_names, kind.__subclasses__()))


def query_failure(text: str) -> str:
    """What a failed Spark query's exception ``text`` says a user should read: the last
    slatepy error in it (``IngestConflict: ...``, the end of its Python worker's traceback,
    where a chain of causes ends), or else its first line."""
    names = _error_names()  # slatepy.sources's errors among them (imported above)
    for line in reversed(text.splitlines()):
        found = re.match(r"\s*(?:[\w.]+\.)?(\w+): (.+)", line)
        if found and found[1] in names:
            return f"{found[1]}: {found[2]}"
    return f"SlatepyError: {text.splitlines()[0] if text else 'the query failed'}"


def run_spark(args: argparse.Namespace, stop: threading.Event, session: Any = None) -> int:
    """``--spark``: one streaming query, source to ``slatepy.persist``, until stopped (the
    same remap shard, resumption and commits as in-process: RFC 0027 §10). In ``session``
    when given (an embedding program's; left running), else in a new one on ``--master``."""
    from pyspark.sql import SparkSession

    from slatepy.spark import register

    if args.checkpoint is None and not args.into.startswith("file://"):
        print("slatepy ingest: --spark needs --checkpoint (a directory)", file=sys.stderr)
        return 1
    checkpoint = args.checkpoint or f"{args.into[len('file://') :]}/_spark/{args.shard}"
    # Python workers on this interpreter (where slatepy is installed), as local_session does.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    shared = session
    spark = shared or (
        SparkSession.builder.master(args.master)
        .appName(f"slatepy ingest {args.shard}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        # Python data sources are looked up in the JVM's active session, which is per thread.
        jvm: Any = spark._jvm
        jvm.SparkSession.setActiveSession(spark._jsparkSession)
        register(spark)
        reader = spark.readStream.option("url", args.into).option("shard", args.shard)
        if args.consensus:
            reader = reader.option("consensus", args.consensus)
        if args.source == "loadgen":
            reader = reader.format("slatepy.loadgen").option("partitions", str(args.partitions))
            reader = reader.option("rate", str(args.rate))
        else:
            if not args.publication:
                raise SlatepyError("a PostgreSQL source needs --publication")
            reader = reader.format("slatepy.postgres").option("connection", args.source)
            reader = reader.option("publication", args.publication)
            if args.slot:
                reader = reader.option("slot", args.slot)
        writer = (
            reader.load()
            .writeStream.format("slatepy.persist")
            .option("url", args.into)
            .option("shard", args.shard)
            .option("timeColumn", "time")
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second")
        )
        if args.consensus:
            writer = writer.option("consensus", args.consensus)
        if args.catalog:
            writer = writer.option("catalog", args.catalog)
        query = writer.start()
        while not stop.wait(max(0.5, args.report_interval)):
            if query.exception() is not None:
                print(f"slatepy ingest: {query_failure(str(query.exception()))}", file=sys.stderr)
                return 1
            progress = query.lastProgress
            if progress:
                print(
                    f"ingest {args.shard} (Spark {args.master}): batch "
                    f"{progress.get('batchId')}, {progress.get('numInputRows')} updates, "
                    f"offsets {progress['sources'][0].get('endOffset')}",
                    flush=True,
                )
        query.stop()
    except SlatepyError as exc:
        print(f"slatepy ingest: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if shared is None:
            spark.stop()
    print(f"ingest {args.shard}: stopped", flush=True)
    return 0
