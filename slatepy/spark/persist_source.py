"""Reading a persist shard from Spark (RFC 0016, "Persist source"): a consolidated
snapshot, and a stream of its updates with the shard's uppers as offsets.

Snapshot (one consistent view; ``asOf``, alias ``as_of``, defaults to the upper minus one)::

    spark.read.format("slatepy.persist").option("url", URL).option("shard", S)
        .option("asOf", 41).load()           # key binary, value binary, time long, diff long

``asOf`` is a time of the shard (the sink's update times: a micro-batch's ``batchId`` or the
``timeColumn``): every update at a time ``<= asOf``, its time advanced to ``asOf``, summed
per ``(key, value)``, zero diffs dropped (``ReadHandle.snapshot``). ``asOf`` must lie in
``[since, upper)``; anything else is an error naming ``asOf``.

Stream::

    spark.readStream.format("slatepy.persist").option("url", URL).option("shard", S).load()

Offsets are ``{"shard": S, "upper": u}``. The first micro-batch is the snapshot as of its end
upper minus one (so it starts from whatever the shard accumulated), every later one the
updates at times in ``[start, end)`` with their own times (a listen). The long-lived driver
reader holds a leased reader whose since ``commit(end)`` downgrades to ``end - 1``: a replay
never starts below a committed end, so nothing it needs is compacted away. ``latestOffset``
polls the upper at most every ``pollInterval`` seconds (default 0.5; Spark calls it ~90
times a second when idle). ``Trigger.AvailableNow`` reads up to the upper at its start.
Options: ``url`` (a plain path is a local one), ``shard`` (required), ``consensus``,
``pollInterval``, ``maxPartitions``; for ``read``: ``asOf``.

A snapshot (a read, or a stream's first micro-batch) is split into at most
``maxPartitions`` (default 8) Spark partitions by **key range**: the cuts are update keys
taken from the blob parts' key bounds (``persist.ranges.split_keys``), each partition reads
the snapshot of its ``[lower, upper)`` of keys (``ReadHandle.snapshot_iter(keys=...)``,
reading only the parts that may hold them), and every key's updates are consolidated in
one partition: the rows are exactly the one-partition snapshot's (RFC 0025, Addendum
A). A shard too small for blob parts reads as one partition.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from slatepy.errors import InvalidArgument
from slatepy.persist import PersistClient, ReadHandle, Updates
from slatepy.persist.errors import SinceError
from slatepy.persist.ranges import ranges, split_keys
from slatepy.persist.state.records import HollowBatch, State
from slatepy.spark.persist_options import shard_options

SCHEMA = "key binary, value binary, time long, diff long"
ARROW_SCHEMA = pa.schema(
    [("key", pa.binary()), ("value", pa.binary()), ("time", pa.int64()), ("diff", pa.int64())]
)
BATCH_ROWS = 8192
READ_OPTIONS = frozenset({"url", "path", "shard", "consensus", "asof", "as_of", "maxpartitions"})
STREAM_OPTIONS = frozenset(
    {
        "url",
        "path",
        "shard",
        "consensus",
        "pollinterval",
        "maxrowspertrigger",
        "maxbytespertrigger",
        "startingoffsets",
        "maxpartitions",
    }
)
DEFAULT_MAX_PARTITIONS = 8


@dataclass(frozen=True)
class SourceConfig:
    url: str
    shard: str
    consensus: str | None
    as_of: int | None = None
    poll_interval: float = 0.5
    max_rows: int | None = None
    max_bytes: int | None = None
    starting: str | int = "earliest"
    max_partitions: int = DEFAULT_MAX_PARTITIONS


def source_config(options: Mapping[str, str], *, stream: bool) -> SourceConfig:
    """Check a read's options.

    Raises:
        InvalidArgument: naming the unknown, missing or malformed option.
    """
    opts, url, shard = shard_options(options, STREAM_OPTIONS if stream else READ_OPTIONS)
    as_of = None
    text = opts.get("asof", opts.get("as_of"))
    if "asof" in opts and "as_of" in opts and opts["asof"] != opts["as_of"]:
        raise InvalidArgument('slatepy.persist: options "asOf" and "as_of" (its alias) disagree')
    if text is not None:
        try:
            as_of = int(text)
        except ValueError:
            as_of = -1
        if as_of < 0:
            raise InvalidArgument('slatepy.persist: option "asOf" must be an integer >= 0')
    poll = 0.5
    if "pollinterval" in opts:
        try:
            poll = float(opts["pollinterval"])
        except ValueError:
            poll = -1.0
        if not 0 <= poll <= 3600:
            raise InvalidArgument('slatepy.persist: option "pollInterval" must be seconds >= 0')
    limits: list[int | None] = []
    for name in ("maxRowsPerTrigger", "maxBytesPerTrigger"):
        text = opts.get(name.lower())
        limits.append(None if text is None else _positive(text, name))
    starting: str | int = opts.get("startingoffsets", "earliest").lower()
    if starting not in ("earliest", "latest"):
        try:
            starting = int(starting)
        except ValueError:
            starting = -1
        if starting < 0:
            raise InvalidArgument(
                'slatepy.persist: option "startingOffsets" must be "earliest", "latest" or an '
                "upper (an integer >= 0)"
            )
    pieces = opts.get("maxpartitions")
    return SourceConfig(
        url,
        shard,
        opts.get("consensus"),
        as_of,
        poll,
        max_rows=limits[0],
        max_bytes=limits[1],
        starting=starting,
        max_partitions=DEFAULT_MAX_PARTITIONS
        if pieces is None
        else _positive(pieces, "maxPartitions"),
    )


def _positive(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise InvalidArgument(f'slatepy.persist: option "{name}" must be an integer > 0')
    return value


def admitted_upper(
    trace: Sequence[HollowBatch],
    lower: int,
    upper: int,
    max_rows: int | None,
    max_bytes: int | None,
) -> int:
    """The largest batch boundary in ``(lower, upper]`` whose batches above ``lower`` hold at
    most ``max_rows`` updates and ``max_bytes`` part bytes, or the first such boundary (a
    micro-batch always makes progress). Counts are the trace's (before consolidation; a
    merged batch counts whole), so the limits are honoured at batch granularity."""
    rows = size = 0
    admitted = lower
    for batch in trace:
        end = batch.desc.upper
        if end is None or end <= lower:
            continue
        rows += batch.updates
        size += sum(
            getattr(part, "size", None) or len(getattr(part, "data", b"")) for part in batch.parts()
        )
        over = (max_rows is not None and rows > max_rows) or (
            max_bytes is not None and size > max_bytes
        )
        if over and admitted > lower:
            break
        admitted = min(end, upper)
        if admitted >= upper or over:
            break
    return admitted if admitted > lower else upper


def _open(config: SourceConfig) -> PersistClient:
    return PersistClient.open(config.url, consensus=config.consensus)


def _to_batches(
    updates: Iterator[tuple[tuple[bytes, bytes], int, int]],
) -> Iterator[pa.RecordBatch]:
    keys: list[bytes] = []
    values: list[bytes] = []
    times: list[int] = []
    diffs: list[int] = []
    for (key, value), t, diff in updates:
        keys.append(key)
        values.append(value)
        times.append(t)
        diffs.append(diff)
        if len(keys) >= BATCH_ROWS:
            yield pa.RecordBatch.from_arrays(
                [pa.array(keys, pa.binary()), pa.array(values, pa.binary()), times, diffs],
                schema=ARROW_SCHEMA,
            )
            keys, values, times, diffs = [], [], [], []
    if keys:
        yield pa.RecordBatch.from_arrays(
            [pa.array(keys, pa.binary()), pa.array(values, pa.binary()), times, diffs],
            schema=ARROW_SCHEMA,
        )


Keys = tuple[bytes | None, bytes | None]
"""A partition's ``[lower, upper)`` of update keys (None: unbounded)."""
EVERY_KEY: Keys = (None, None)


def key_ranges(state: State, as_of: int, pieces: int) -> list[Keys]:
    """The key ranges a snapshot as of ``as_of`` is read in: at most ``pieces``, cut at
    the blob parts' keys of ``state`` (any cuts give exact results, whatever state the
    partitions then read: the parts only balance them)."""
    runs = [run for batch in state.trace if batch.desc.lower <= as_of for run in batch.runs]
    return ranges(split_keys(runs, pieces))


@dataclass(frozen=True)
class SnapshotPartition(InputPartition):
    """Read the snapshot as of ``as_of`` (None: the shard is empty) of the keys ``keys``."""

    as_of: int | None
    keys: Keys = EVERY_KEY


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """Read the updates at times in ``[start, end)``; ``start == 0``: the snapshot as of
    ``end - 1`` instead (the stream's first micro-batch)."""

    start: int
    end: int
    keys: Keys = EVERY_KEY


def read_snapshot(
    config: SourceConfig, as_of: int, keys: Keys = EVERY_KEY
) -> Iterator[pa.RecordBatch]:
    with _open(config) as client:
        reader = client.open_leased_reader(config.shard, purpose="spark snapshot")
        try:
            yield from _to_batches(reader.snapshot_iter(as_of, keys=keys))
        finally:
            reader.expire()


def read_range(
    config: SourceConfig, start: int, end: int, keys: Keys = EVERY_KEY
) -> Iterator[pa.RecordBatch]:
    """The updates at times in ``[start, end)`` with their times (a listen from ``start -
    1`` until its frontier reaches ``end``); ``start == 0``: the snapshot as of ``end - 1``
    of the keys ``keys``."""
    if start == 0:
        yield from read_snapshot(config, end - 1, keys)
        return
    with _open(config) as client:
        reader = client.open_leased_reader(config.shard, purpose="spark listen")
        try:
            listen = reader.listen(start - 1)
            try:
                while listen.frontier is not None and listen.frontier < end:
                    for event in listen.fetch_next(timeout=60):
                        if isinstance(event, Updates):
                            yield from _to_batches(u for u in event.updates if u[1] < end)
            finally:
                listen.close()
        finally:
            reader.expire()


class PersistSnapshotReader(DataSourceReader):
    """``spark.read.format("slatepy.persist")``: one snapshot, split by key range."""

    def __init__(self, config: SourceConfig) -> None:
        self.config = config

    def partitions(self) -> Sequence[InputPartition]:
        config = self.config
        with _open(config) as client:
            state = client.machine(config.shard).fetch()
        upper, since = state.upper, state.since
        as_of = config.as_of
        if as_of is None:
            if upper == 0:
                return [SnapshotPartition(None)]
            as_of = (upper - 1) if upper is not None else None
            if as_of is None:
                raise InvalidArgument(
                    f'slatepy.persist: shard {config.shard!r} is closed; give option "asOf"'
                )
        if upper is not None and as_of >= upper:
            raise InvalidArgument(
                f'slatepy.persist: option "asOf" {as_of} is not below the shard\'s upper '
                f"{upper} (not complete yet)"
            )
        if since is None or as_of < since:
            raise InvalidArgument(
                f'slatepy.persist: option "asOf" {as_of} is before the shard\'s since {since} '
                "(compacted away)"
            )
        keys = key_ranges(state, as_of, config.max_partitions)
        return [SnapshotPartition(as_of, k) for k in keys]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SnapshotPartition)
        if partition.as_of is None:
            return
        try:
            yield from read_snapshot(self.config, partition.as_of, partition.keys)
        except SinceError as exc:
            raise InvalidArgument(
                f'slatepy.persist: option "asOf" {partition.as_of}: {exc}'
            ) from exc


class PersistStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("slatepy.persist")``: offsets are uppers."""

    def __init__(self, config: SourceConfig) -> None:
        self.config = config
        self._client: PersistClient | None = None
        self._reader: ReadHandle | None = None
        self._upper: int = 0
        self._polled = float("-inf")
        self._until: int | None = None

    def _handle(self) -> tuple[PersistClient, ReadHandle]:
        if self._client is None or self._reader is None:
            self._client = _open(self.config)
            self._reader = self._client.open_leased_reader(self.config.shard, purpose="spark")
        return self._client, self._reader

    def _offset(self, upper: int) -> dict[str, Any]:
        return {"shard": self.config.shard, "upper": upper}

    def _check(self, offset: Mapping[str, Any]) -> int:
        if offset.get("shard") != self.config.shard:
            raise InvalidArgument(
                f"slatepy.persist: the checkpoint's offsets are of shard {offset.get('shard')!r}, "
                f'not of option "shard" {self.config.shard!r}'
            )
        return int(offset["upper"])

    def _poll(self) -> int:
        now = time.monotonic()
        if now - self._polled >= self.config.poll_interval:
            client, _ = self._handle()
            upper = client.machine(self.config.shard).fetch().upper
            if upper is None:  # closed: nothing more arrives; the last complete time
                upper = self._upper
            self._upper, self._polled = max(self._upper, upper), now
        return self._upper

    def initialOffset(self) -> dict[str, Any]:
        """``startingOffsets``: ``earliest`` (0: the first micro-batch is a snapshot),
        ``latest`` (the shard's upper now: only updates after it), or an upper."""
        starting = self.config.starting
        if starting == "earliest":
            return self._offset(0)
        if starting == "latest":
            self._polled = float("-inf")
            return self._offset(self._poll())
        assert isinstance(starting, int)
        return self._offset(starting)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.config.max_rows is not None:
            return ReadMaxRows(self.config.max_rows)
        if self.config.max_bytes is not None:
            return ReadMaxBytes(self.config.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._polled = float("-inf")
        self._until = self._poll()

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        lower = 0 if start is None else self._check(start)
        upper = max(lower, self._until if self._until is not None else self._poll())
        limited = self.config.max_rows is not None or self.config.max_bytes is not None
        if upper > lower and limited and not isinstance(limit, ReadAllAvailable):
            client, _ = self._handle()
            trace = client.machine(self.config.shard).state.trace  # cached by the poll
            upper = admitted_upper(trace, lower, upper, self.config.max_rows, self.config.max_bytes)
        return self._offset(upper)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        lo, hi = self._check(start), self._check(end)
        if hi <= lo:
            return []
        if lo > 0:
            return [RangePartition(lo, hi)]
        client, _ = self._handle()
        state = client.machine(self.config.shard).fetch()
        keys = key_ranges(state, hi - 1, self.config.max_partitions)
        return [RangePartition(lo, hi, k) for k in keys]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        yield from read_range(self.config, partition.start, partition.end, partition.keys)

    def commit(self, end: dict[str, Any]) -> None:
        upper = self._check(end)
        if upper > 0:
            _, reader = self._handle()
            reader.downgrade_since(upper - 1)

    def stop(self) -> None:
        if self._reader is not None:
            self._reader.expire()
        if self._client is not None:
            self._client.close()
        self._reader = self._client = None
