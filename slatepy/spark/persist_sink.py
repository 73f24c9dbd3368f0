"""The ``slatepy.persist`` sink: a DataFrame or a stream appended to a persist shard
(RFC 0016, "Persist sink"; the persist side in RFC 0015 Addendum E).

Streaming::

    slatepy.spark.register(spark)
    query = (
        df.writeStream.format("slatepy.persist")        # df: key, value[, diff][, time column]
        .option("url", "s3://bucket/persist")
        .option("shard", "orders")
        .option("checkpointLocation", "s3://bucket/checkpoints/orders")
        .start()
    )

One-off (``.mode("append")`` is required: Python sinks know no other save mode)::

    df.write.format("slatepy.persist").mode("append").option("url", URL).option("shard", S).save()

Columns: ``key`` and ``value`` (binary, or string stored as UTF-8), optional ``diff`` (an
integer column, default 1) and, with the ``timeColumn`` option, the update time (an integer
column, u64). Without it a micro-batch's updates are at its ``batchId`` (a one-off write's
at time 0); either way an update below the shard's upper when the append lands is forwarded
to that upper. No other column is accepted.

The protocol (the seed's ``mint_batch_descriptions`` / ``write_batches`` /
``append_batches``):

* every task writes its rows into one persist batch with ``WriteHandle.builder`` (bounded
  memory: full buffers become parts on blob) and ships it to the driver in its commit
  message (``Batch.to_bytes``, a few hundred bytes: part references, not data);
* the driver's ``commit(messages, batchId)`` reads the shard's upper ``u`` and applies all
  the batches with one ``compare_and_append_batch([...], u, max(u, t_max) + 1,
  idempotency=(query id, batchId), forward=True)``; on ``UpperMismatch`` (another writer
  appended) it re-mints from the new upper and tries again;
* a replayed micro-batch (after a driver crash, Spark re-runs it and commits the same
  ``batchId`` again) finds its key recorded and appends nothing;
* ``abort`` deletes the batches named in its messages only when a task failed (no commit
  ran with them); after a failed commit, whose append may have landed, it deletes nothing
  (``slatepy.spark.cleanup``, RFC 0025). Persist's GC deletes every unreferenced part
  (those, a replay's, failed task attempts') after ``batch_lease``.

Options (case-insensitive): ``url`` and ``shard`` (required; a plain path is a local
location), ``timeColumn``, ``consensus`` (a ``postgresql://`` URL; default: the log on the
blob store), ``key``/``value`` (encode other columns as the ``slatepy`` source does), for
streams ``writerId`` (names the idempotency key, ``writer:<writerId>:<query id>``; another
query's key under the same ``writerId`` refuses the commit: RFC 0025), and for one-off writes
``idempotencyKey`` + ``idempotencyId`` (both or neither: a retried job with the same pair
appends once). An append skipped as already applied is logged at WARNING.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from slatepy.errors import InvalidArgument
from slatepy.persist import Batch, PersistClient, UpperMismatch, WriteHandle
from slatepy.spark.cleanup import commit_never_ran, left_to_gc, log
from slatepy.spark.codec import Column, RowCodec
from slatepy.spark.persist_options import shard_options
from slatepy.spark.registration import register_persist_sink

SINK_NAME = "slatepy.persist"

COMMON_OPTIONS = frozenset({"url", "shard", "timecolumn", "consensus", "key", "value", "catalog"})
STREAM_OPTIONS = COMMON_OPTIONS | {"checkpointlocation", "queryname", "path", "writerid"}
BATCH_OPTIONS = COMMON_OPTIONS | {"idempotencykey", "idempotencyid", "path"}

MINT_ATTEMPTS = 1000
"""Re-mints a commit tries before giving up (each one another writer's append landing)."""

MAINTENANCE_WAIT = 30.0
"""Seconds a commit waits for the merges its append claimed before its process ends, while
the shard's trace is short (at most :data:`TRACE_BOUND` batches)."""

TRACE_BOUND = 32
"""Trace batches above which a commit waits for its merges to finish (up to
:data:`MAINTENANCE_MAX_WAIT`) instead of abandoning them after :data:`MAINTENANCE_WAIT`: a
merge abandoned is restarted from scratch by whoever claims it after ``merge_lease``, so one
that outlasts every commit's wait would never finish and the trace would grow by a batch per
micro-batch until appends stall."""

MAINTENANCE_MAX_WAIT = 1800.0
"""Seconds a commit waits at most for its merges while the trace is long."""

_INTEGER_TYPES = (ByteType, ShortType, IntegerType, LongType)
_BYTES_TYPES = (BinaryType, StringType)


@dataclass(frozen=True)
class SinkConfig:
    """The sink's validated options and column layout (picklable)."""

    url: str
    shard: str
    consensus: str | None
    time_column: str | None
    has_diff: bool
    writer_id: str | None
    idempotency: tuple[str, int] | None
    codec: RowCodec | None = None
    """With option ``key`` or ``value``: the KV source's row codec over the columns other
    than ``diff`` and the time column (None: the columns ``key`` and ``value`` as bytes)."""


def sink_config(options: Mapping[str, str], schema: StructType, *, stream: bool) -> SinkConfig:
    """Check the options and the DataFrame's columns before any task runs (so nothing is
    written for a bad query).

    Raises:
        InvalidArgument: naming the unknown or missing option, or the bad column.
    """
    opts, url, shard = shard_options(options, STREAM_OPTIONS if stream else BATCH_OPTIONS)
    fields = {field.name: field for field in schema.fields}
    time_column = opts.get("timecolumn")
    if time_column is not None:
        field = fields.get(time_column)
        if field is None or time_column in ("key", "value", "diff"):
            raise InvalidArgument(
                f'slatepy.persist: option "timeColumn": no integer column {time_column!r}'
            )
        if not isinstance(field.dataType, _INTEGER_TYPES):
            raise InvalidArgument(
                f'slatepy.persist: option "timeColumn": column {time_column!r} must be an '
                f"integer type, not {field.dataType.simpleString()}"
            )
    has_diff = "diff" in fields
    if has_diff and not isinstance(fields["diff"].dataType, _INTEGER_TYPES):
        raise InvalidArgument('slatepy.persist: column "diff" must be an integer type')
    codec = None
    if "key" in opts or "value" in opts:
        row = [
            Column(f.name, f.dataType.typeName(), f.nullable)
            for f in schema.fields
            if f.name not in ("diff", time_column)
        ]
        keys = [name.strip() for name in opts.get("key", "key").split(",") if name.strip()]
        codec = RowCodec.of(row, keys, opts.get("value"))
    else:
        for name in ("key", "value"):
            field = fields.get(name)
            if field is None:
                raise InvalidArgument(
                    f'slatepy.persist: the DataFrame has no "{name}" column (or name the '
                    'key column(s) with option "key", as for the slatepy source)'
                )
            if not isinstance(field.dataType, _BYTES_TYPES):
                raise InvalidArgument(
                    f'slatepy.persist: column "{name}" must be binary or string, not '
                    f"{field.dataType.simpleString()}"
                )
        extra = sorted(
            set(fields) - {"key", "value", "diff", *([time_column] if time_column else [])}
        )
        if extra:
            raise InvalidArgument(
                f"slatepy.persist: unexpected column(s) {extra}: the sink takes key, value, "
                'diff and the "timeColumn" option\'s column (or set option "key"/"value" '
                "to encode other columns as the slatepy source does)"
            )
    idempotency = None
    key, ident = opts.get("idempotencykey"), opts.get("idempotencyid")
    if (key is None) != (ident is None):
        missing = "idempotencyId" if ident is None else "idempotencyKey"
        raise InvalidArgument(
            f'slatepy.persist: option "{missing}" is required with the other of '
            "idempotencyKey/idempotencyId"
        )
    if key is not None and ident is not None:
        try:
            number = int(ident)
        except ValueError:
            number = -1
        if not key or not 0 <= number < 1 << 63:
            raise InvalidArgument(
                'slatepy.persist: option "idempotencyId" must be an integer >= 0 and '
                'option "idempotencyKey" non-empty'
            )
        idempotency = ("user:" + key, number)
    writer_id = opts.get("writerid")
    if writer_id is not None and (not writer_id or len(writer_id) > 160 or ":" in writer_id):
        raise InvalidArgument(
            'slatepy.persist: option "writerId" must be 1 to 160 characters without ":"'
        )
    if "catalog" in opts:  # on the driver, before anything is written (RFC 0028 Addendum C)
        register_persist_sink(opts["catalog"], url, shard)
    return SinkConfig(
        url=url,
        shard=shard,
        consensus=opts.get("consensus"),
        time_column=time_column,
        has_diff=has_diff,
        writer_id=writer_id,
        idempotency=idempotency,
        codec=codec,
    )


@dataclass(frozen=True)
class PersistCommitMessage(WriterCommitMessage):
    """What a task sends the driver: its batch (``Batch.to_bytes``; None: no rows), the
    largest update time, its row count, and the streaming query id (None: a one-off)."""

    batch: bytes | None
    max_time: int | None
    rows: int
    query_id: str | None


class PersistDataSource(DataSource):
    """``format("slatepy.persist")``: the sink (this module's docstring) and the snapshot and
    listen sources (``slatepy.spark.persist_source``)."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def schema(self) -> str:
        from slatepy.spark.persist_source import SCHEMA

        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        from slatepy.spark.persist_source import PersistSnapshotReader, source_config

        return PersistSnapshotReader(source_config(self.options, stream=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from slatepy.spark.persist_source import PersistStreamReader, source_config

        return PersistStreamReader(source_config(self.options, stream=True))

    def writer(self, schema: StructType, overwrite: bool) -> PersistBatchWriter:
        if overwrite:
            raise InvalidArgument('slatepy.persist: only .mode("append") is supported')
        return PersistBatchWriter(sink_config(self.options, schema, stream=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> PersistStreamWriter:
        if overwrite:
            raise InvalidArgument('slatepy.persist: only outputMode("append") is supported')
        return PersistStreamWriter(sink_config(self.options, schema, stream=True))


def _open(config: SinkConfig) -> PersistClient:
    return PersistClient.open(config.url, consensus=config.consensus)


def _bytes_column(batch: pa.RecordBatch, name: str) -> list[bytes]:
    column = batch.column(name)
    if column.null_count:
        raise InvalidArgument(f'slatepy.persist: column "{name}" has a null')
    if not pa.types.is_binary(column.type):
        column = pc.cast(column, pa.binary())
    return column.to_pylist()  # type: ignore[no-any-return]


def _int_column(batch: pa.RecordBatch, name: str, what: str) -> list[int]:
    column = batch.column(name)
    if column.null_count:
        raise InvalidArgument(f"slatepy.persist: {what} {name!r} has a null")
    return column.to_pylist()  # type: ignore[no-any-return]


def write_task(
    config: SinkConfig, batches: Iterator[pa.RecordBatch], default_time: int, query_id: str | None
) -> PersistCommitMessage:
    """One task: its rows into one persist batch (written, not applied)."""
    rows = 0
    with _open(config) as client:
        write = client.open_writer(config.shard, purpose="spark sink task")
        builder = write.builder(0)
        for record_batch in batches:
            n = record_batch.num_rows
            if not n:
                continue
            if config.codec is None:
                keys = _bytes_column(record_batch, "key")
                values = _bytes_column(record_batch, "value")
            else:
                names = [c.name for c in config.codec.columns]
                keys, values = config.codec.from_batch(record_batch.select(names))
            if config.time_column is not None:
                times = _int_column(record_batch, config.time_column, "time column")
            else:
                times = [default_time] * n
            diffs = _int_column(record_batch, "diff", "column") if config.has_diff else [1] * n
            builder.extend(zip(zip(keys, values, strict=True), times, diffs, strict=True))
            rows += n
        max_time = builder.max_time
        batch = builder.finish(None)
        shipped = batch.to_bytes() if batch.record.runs else None
    return PersistCommitMessage(shipped, max_time, rows, query_id)


def _batches(write: WriteHandle, messages: Sequence[Any]) -> list[Batch]:
    return [
        write.batch_from_bytes(m.batch)
        for m in messages
        if isinstance(m, PersistCommitMessage) and m.batch is not None
    ]


def commit_batches(
    config: SinkConfig,
    messages: Sequence[Any],
    *,
    idempotency: tuple[str, int] | None,
    min_time: int,
    writer_prefix: str | None = None,
) -> bool:
    """The driver's ``append_batches``: mint ``[u, max(u, t_max) + 1)`` from the shard's
    upper ``u``, apply every task's batch with one ``compare_and_append_batch`` (recording
    ``idempotency``), re-mint on ``UpperMismatch``. Answers False when the key said the
    append was applied already (logged at WARNING; the batches are left to GC).

    Raises:
        InvalidArgument: ``writer_prefix`` (``writer:<writerId>:``) names a recorded key of
            another query than ``idempotency``'s: a ``writerId`` reused by a query on a new
            checkpoint, whose batch ids restart and would be skipped as applied.
    """
    times = [m.max_time for m in messages if isinstance(m, PersistCommitMessage)]
    t_max = max([min_time, *(t for t in times if t is not None)])
    with _open(config) as client:
        write = client.open_writer(config.shard, purpose="spark sink commit")
        batches = _batches(write, messages)
        try:
            if writer_prefix is not None and idempotency is not None:
                _refuse_reused_writer(client, config, writer_prefix, idempotency[0])
            upper = write.fetch_recent_upper()
            for _ in range(MINT_ATTEMPTS):
                if upper is None:
                    raise InvalidArgument(
                        f"slatepy.persist: shard {config.shard!r} is closed (its upper is None)"
                    )
                try:
                    applied = write.compare_and_append_batch(
                        batches,
                        upper,
                        max(upper, t_max) + 1,
                        idempotency=idempotency,
                        forward=True,
                    )
                except UpperMismatch as exc:
                    upper = exc.current
                    continue
                if not applied and idempotency is not None:
                    # These batches were not appended by this call, but nothing proves that
                    # no earlier commit with these same messages appended them (merges may
                    # have moved their parts since): GC deletes them once unreferenced.
                    recorded = client.machine(config.shard).fetch().idempotency.get(idempotency[0])
                    log.warning(
                        "slatepy.persist: shard %r: skipped as already applied: key %r is "
                        "recorded at id %s, this append's id is %d; %d row(s) not appended "
                        "(a replay of an applied micro-batch or retried job)",
                        config.shard,
                        idempotency[0],
                        None if recorded is None else recorded.id,
                        idempotency[1],
                        sum(m.rows for m in messages if isinstance(m, PersistCommitMessage)),
                    )
                _wait_maintenance(client, config.shard)
                return applied
            raise InvalidArgument(
                f"slatepy.persist: no append to {config.shard!r} after {MINT_ATTEMPTS} attempts "
                "(other writers kept moving the upper)"
            )
        finally:
            write.expire()


def _wait_maintenance(client: PersistClient, shard: str) -> None:
    """Wait for the merges this commit's append claimed (taking over claims that expired,
    as every append does): up to :data:`MAINTENANCE_WAIT`, then on while the trace is longer
    than :data:`TRACE_BOUND` (see there), up to :data:`MAINTENANCE_MAX_WAIT`."""
    if client.wait_maintenance(MAINTENANCE_WAIT):
        return
    machine = client.machine(shard)
    deadline = time.monotonic() + MAINTENANCE_MAX_WAIT
    while len(machine.state.trace) > TRACE_BOUND:
        if client.wait_maintenance(min(1.0, max(0.0, deadline - time.monotonic()))):
            return
        if time.monotonic() >= deadline:
            log.warning(
                "slatepy.persist: shard %r: merges still running after %.0f s with %d batches "
                "in the trace; abandoned (another writer takes them over after merge_lease)",
                shard,
                MAINTENANCE_WAIT + MAINTENANCE_MAX_WAIT,
                len(machine.state.trace),
            )
            return


def _refuse_reused_writer(client: PersistClient, config: SinkConfig, prefix: str, key: str) -> None:
    others = sorted(
        k
        for k in client.machine(config.shard).fetch().idempotency
        if k.startswith(prefix) and k != key
    )
    if others:
        raise InvalidArgument(
            f'slatepy.persist: option "writerId" {config.writer_id!r} was used by another '
            f"streaming query on shard {config.shard!r} (recorded keys {others}; this query's "
            f"is {key!r}): a query on a new checkpoint restarts its batch ids, and its batches "
            "would be skipped as already applied. Give this query a new writerId, or restart "
            "the old query from its own checkpoint"
        )


def abort_batches(
    config: SinkConfig, messages: Sequence[Any], *, idempotency: tuple[str, int] | None
) -> None:
    """Spark's ``abort``: delete the batches named in ``messages`` only when no commit ran
    with them (a task failed: a ``None`` slot), none of their parts is in the shard's
    trace and ``idempotency`` (if known) is not recorded at or beyond its id. After a
    commit ran, delete nothing: its append may have landed (``slatepy.spark.cleanup``).
    Persist's GC deletes unreferenced parts after ``batch_lease``."""
    named = [m for m in messages if isinstance(m, PersistCommitMessage) and m.batch]
    if not named:
        return
    if not commit_never_ran(messages):
        left_to_gc(f"persist sink into {config.shard!r}", len(named), "persist GC")
        return
    with _open(config) as client:
        write = client.open_writer(config.shard, purpose="spark sink abort")
        try:
            state = client.machine(config.shard).fetch()
            if idempotency is not None:
                applied = state.idempotency.get(idempotency[0])
                if applied is not None and applied.id >= idempotency[1]:
                    return  # covered by a recorded key: leave it to GC
            referenced = {key for batch in state.trace for key in batch.part_keys()}
            for batch in _batches(write, named):
                if not referenced.intersection(_part_keys(batch)):
                    batch.delete()
        finally:
            write.expire()


def _part_keys(batch: Batch) -> set[str]:
    return {key for run in batch.record.runs for part in run if (key := getattr(part, "key", None))}


class PersistBatchWriter(DataSourceArrowWriter):
    """``df.write``: each task writes a batch; ``commit`` appends them all at once."""

    def __init__(self, config: SinkConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PersistCommitMessage:
        return write_task(self.config, iterator, 0, None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_batches(self.config, messages, idempotency=self.config.idempotency, min_time=0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_batches(self.config, messages, idempotency=self.config.idempotency)


class PersistStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream``: one append per micro-batch, exactly once per ``batchId``."""

    def __init__(self, config: SinkConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PersistCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        query_id = batch_id = None
        if context is not None:
            query_id = context.getLocalProperty("sql.streaming.queryId")
            batch_id = context.getLocalProperty("streaming.sql.batchId")
        if query_id is None or batch_id is None:
            raise InvalidArgument("slatepy.persist: a stream task without a query or batch id")
        return write_task(self.config, iterator, int(batch_id), query_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if not any(isinstance(m, PersistCommitMessage) for m in messages):
            return  # no task ran: nothing to append, no query id to record
        prefix = None if self.config.writer_id is None else f"writer:{self.config.writer_id}:"
        commit_batches(
            self.config,
            messages,
            idempotency=(self._key(messages), batchId),
            min_time=batchId if self.config.time_column is None else 0,
            writer_prefix=prefix,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        try:
            key: tuple[str, int] | None = (self._key(messages), batchId)
        except InvalidArgument:
            key = None  # no task reported a query id: no commit can have recorded one
        abort_batches(self.config, messages, idempotency=key)

    def _key(self, messages: Sequence[Any]) -> str:
        """``spark:<query id>``, or ``writer:<writerId>:<query id>``: the query id (kept in
        the checkpoint) scopes a key to one checkpoint, whose batch ids only grow."""
        ids = {m.query_id for m in messages if isinstance(m, PersistCommitMessage)}
        ids.discard(None)
        if len(ids) != 1:
            raise InvalidArgument(
                f"slatepy.persist: cannot tell the streaming query id from the tasks ({ids})"
            )
        query = str(ids.pop())
        if self.config.writer_id:
            return f"writer:{self.config.writer_id}:{query}"
        return "spark:" + query
