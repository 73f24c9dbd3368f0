"""``spark.readStream.format("slatepy.postgres")``: a one-table publication's logical
replication as a Spark stream, reclocked through the remap shard ``S.remap`` for
``slatepy.persist`` (RFC 0027 §9)::

    df = spark.readStream.format("slatepy.postgres").option("connection", PG_URL) \
        .option("publication", P).option("url", URL).option("shard", S).load()
    df.writeStream.format("slatepy.persist").option("url", URL).option("shard", S) \
        .option("timeColumn", "time").option("checkpointLocation", CKPT).start()

Columns ``key``, ``value`` (binary), ``time``, ``diff`` (long), as the in-process ingest
writes them. The slot admits one reader, so the driver reads the stream (the source's
``PostgresReader``, snapshot and rewind included) and hands each batch's rows to one task;
Spark's offsets are LSN frontiers ``{"offsets": [lsn]}``, each batch ends on a bound LSN, and
``commit`` sends the standby status update at the resumption frontier the shards' uppers
give, never at Spark's checkpoint. A replayed batch is read again from its start (the slot
still has it: nothing beyond the shards was committed) and gets the same times; what lies
below the shards' resumption frontier when the reader started is not read again (the shards
hold it), and a batch with nothing else in it opens no stream.

Options: ``connection`` (postgresql://…), ``publication`` (exactly one table), ``slot``
(default ``slatepy_<shard>``), ``url``, ``shard``, ``consensus``, ``pollSeconds`` (0.5: how
long a trigger waits for the stream).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from slatepy.errors import InvalidArgument
from slatepy.sources.base import Chunk, OffsetFrontier, Progress, frontier_join
from slatepy.sources.errors import OffsetOutOfRange, SlotLost, SourceUnavailable
from slatepy.sources.postgres import (
    PostgresReader,
    PostgresSource,
    connect,
    format_lsn,
    slot_name_of,
)
from slatepy.spark.reclocked import SCHEMA, Reclocked, arrow_batches, offsets_of

log = logging.getLogger(__name__)

OPTIONS = frozenset(
    {"url", "path", "shard", "consensus", "connection", "publication", "slot", "pollseconds"}
)


@dataclass(frozen=True)
class PostgresConfig:
    url: str
    shard: str
    consensus: str | None
    connection: str
    publication: str
    slot: str
    poll: float


def postgres_config(options: Mapping[str, str]) -> PostgresConfig:
    """The checked options.

    Raises:
        InvalidArgument: naming the unknown or missing option.
    """
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(set(opts) - OPTIONS)
    if unknown:
        raise InvalidArgument(f"slatepy.postgres: unknown option(s) {unknown}")
    url = opts.get("url") or opts.get("path")
    missing = [n for n in ("shard", "connection", "publication") if not opts.get(n)]
    if not url or missing:
        raise InvalidArgument(f"slatepy.postgres: options {['url', *missing]} are required")
    return PostgresConfig(
        url=url,
        shard=opts["shard"],
        consensus=opts.get("consensus"),
        connection=opts["connection"],
        publication=opts["publication"],
        slot=opts.get("slot") or slot_name_of(opts["shard"]),
        poll=float(opts.get("pollseconds", "0.5")),
    )


@dataclass(frozen=True)
class RowsPartition(InputPartition):
    """One batch's rows, already reclocked (read by the driver from the slot)."""

    rows: tuple[tuple[bytes, bytes, int, int], ...]


class PostgresDataSource(DataSource):
    """``format("slatepy.postgres")`` (a stream only)."""

    @classmethod
    def name(cls) -> str:
        return "slatepy.postgres"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return PostgresStreamReader(postgres_config(self.options))


class PostgresStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver side: the replication stream, bindings, planning, committing."""

    replay_timeout = 120.0
    """Seconds a replayed batch may take to be read again to its end, and a
    Trigger.AvailableNow run to read beyond a batch's start (then ``SourceUnavailable``)."""

    def __init__(self, config: PostgresConfig) -> None:
        self.config = config
        self._state = Reclocked(config.url, config.consensus, config.shard)
        self._source: PostgresSource | None = None
        self._stream: PostgresReader | None = None
        self._at: OffsetFrontier = (0,)
        self._chunks: list[Chunk] = []
        self._progress: OffsetFrontier = (0,)
        self._until: int | None = None
        self._durable: OffsetFrontier | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])  # type: ignore[misc]

    def _open(self) -> Reclocked:
        if self._source is None:
            cfg = self.config
            source = PostgresSource(cfg.connection, cfg.publication, slot=cfg.slot)
            if len(source.outputs) != 1:
                raise InvalidArgument(
                    f"slatepy.postgres: publication {cfg.publication!r} has "
                    f"{len(source.outputs)} tables; a Spark stream reads one-table publications "
                    "(`slatepy ingest` takes several)"
                )
            self._source = source
        self._state.open(1, self._source.shapes())
        if self._durable is None:
            # The offset resumption frontier when this reader started: everything below it
            # is in the shards already (written by this stream before a restart, or by
            # another ingest), so no batch needs it read again (as an in-process restart).
            self._durable = self._state.bindings.before(self._state.resumption())
        return self._state

    def _reopen(self, start: OffsetFrontier, deadline: float) -> PostgresReader:
        """A new stream from ``start`` after the last one failed: retried every second
        while the server cannot be reached, until ``deadline``."""
        while True:
            try:
                return self._read_from(start)
            except SourceUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def _read_from(self, start: OffsetFrontier) -> PostgresReader:
        """The stream serving a batch from ``start``: it reads from ``start`` or, when that
        is below the durable frontier (a batch Spark replays after another ingest wrote
        beyond it; the slot may have confirmed beyond ``start`` since), from there."""
        if self._stream is None or self._at != start:
            if self._stream is not None:
                self._stream.close()
            assert self._source is not None and self._durable is not None
            at = frontier_join(start, self._durable)
            try:
                self._stream = self._source.open(at)
            except (SlotLost, OffsetOutOfRange):
                self._stream = None
                # Opening waits for a slot another session holds (5 s); another ingest of
                # the same shards may have committed beyond ``start`` meanwhile. Then the
                # source's "that WAL may be gone" is not true: the conflict does not carry it.
                self._state.check_unmoved("while this stream opened the source")
                raise
            self._at, self._progress, self._chunks = start, at, []
        return self._stream

    def initialOffset(self) -> dict[str, Any]:
        state = self._open()
        return {"offsets": list(state.bindings.before(state.resumption()))}

    def prepareForTriggerAvailableNow(self) -> None:
        conn = connect(self.config.connection)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
                self._until = int(cur.fetchone()[0])
        finally:
            conn.close()

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        state = self._open()
        lo = offsets_of(start) if start else state.bindings.before(state.resumption())
        until = self._until
        if until is not None and lo[0] >= until:
            return {"offsets": list(lo)}
        deadline = time.monotonic() + self.replay_timeout
        while True:
            end = self._next_end(state, lo)
            if end != lo or until is None:
                return {"offsets": list(end)}
            # Trigger.AvailableNow ends the query at the first batch with no new offsets, but
            # the server had written up to ``until`` when it began: a poll that read nothing
            # (a loaded server, a walsender decoding from its restart LSN) is not the end.
            if time.monotonic() > deadline:
                raise SourceUnavailable(
                    f"slot {self.config.slot!r}: no batch from {format_lsn(lo[0])} within "
                    f"{self.replay_timeout:g} s (the stream at {format_lsn(self._progress[0])}), "
                    f"though the server had written up to {format_lsn(until)} when this "
                    "Trigger.AvailableNow run began"
                )

    def _next_end(self, state: Reclocked, lo: OffsetFrontier) -> OffsetFrontier:
        """One poll of the stream from ``lo``; the end of the next batch (``lo``: none yet)."""
        try:
            events = self._read_from(lo).poll(self.config.poll)
        except SourceUnavailable:
            # The server dropped an idle stream between triggers (wal_sender_timeout):
            # read again from the batch's start; nothing below it is needed.
            self._at = (-1,)
            events = self._read_from(lo).poll(self.config.poll)
        self._take(events)
        bound = state.bindings.aligned(lo, self._progress)
        if bound is not None and bound[0] > self._progress[0]:
            return lo  # catching up: the bound LSN is not read yet
        return state.end(lo, self._progress)

    def _take(self, events: Sequence[Chunk | Progress]) -> None:
        for event in events:
            if isinstance(event, Progress):
                self._progress = frontier_join(self._progress, event.frontier)
            else:
                self._chunks.append(event)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        state = self._open()
        lo, hi = offsets_of(start), offsets_of(end)
        assert self._durable is not None
        if hi[0] <= max(lo[0], self._durable[0]):
            # No offset to read: an empty batch (batch 0 of a Trigger.AvailableNow run with
            # nothing new) or one the shards hold already (replayed after another ingest
            # wrote beyond it). The slot is not opened (a replication connection, up to 5 s
            # waiting for a walsender to let go); nothing moves.
            return []
        stream = self._read_from(lo)
        # A batch replayed after a restart (Spark plans it from its offset log, with no
        # latestOffset first) is read again from its start, to its end.
        deadline = time.monotonic() + self.replay_timeout
        while self._progress[0] < hi[0]:
            if time.monotonic() > deadline:
                raise SourceUnavailable(
                    f"slot {self.config.slot!r}: the batch [{format_lsn(lo[0])}, "
                    f"{format_lsn(hi[0])}) was not read again within {self.replay_timeout:g} s "
                    f"(at {format_lsn(self._progress[0])})"
                )
            try:
                self._take(stream.poll(self.config.poll))
            except SourceUnavailable as exc:
                # The stream was dropped (as in latestOffset): read the batch again from its
                # start on a new one, until the deadline; what was taken is dropped with it.
                log.warning("%s; reading the batch again from its start", exc)
                self._at = (-1,)
                stream = self._reopen(lo, deadline)
        rows: list[tuple[bytes, bytes, int, int]] = []
        keep: list[Chunk] = []
        for chunk in self._chunks:
            if chunk.offset >= hi[0]:
                keep.append(chunk)
                continue
            t = state.bindings.time_of(0, chunk.offset)
            assert t is not None
            rows.extend((k, v, t, d) for k, v, d in chunk.rows)
        self._chunks, self._at = keep, hi
        return [RowsPartition(tuple(rows))] if rows else []

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RowsPartition)
        return arrow_batches(partition.rows)

    def commit(self, end: dict[str, Any]) -> None:
        offsets = self._open().commit()
        if offsets is not None and self._stream is not None:
            self._stream.commit(offsets)

    def stop(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._state.close()
