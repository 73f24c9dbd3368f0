"""The ``slatepy`` data source: a KV database read as, and bulk-loaded from, a DataFrame
(RFC 0016).

Bulk load (a missing database is created, as ``Db.open`` does, unless ``createIfMissing``
is ``false``; ``.mode("append")`` is required: Spark's Python sinks refuse the default mode,
and this one refuses ``overwrite``). The load records its columns and key columns in
``spark/table.json`` (``slatepy.spark.table``), so a read needs no ``.schema(...)``::

    (
        df.write.format("slatepy")
        .option("url", "s3://bucket/db")
        .option("key", "id")        # the key column(s); .option("value", col) for raw bytes
        .mode("append")
        .save()
    )

Reading::

    slatepy.spark.register(spark)
    df = (
        spark.read.format("slatepy")
        .schema("id long, name string, score double")   # omit: the loaded layout, or
                                                        # `key binary, value binary`
        .option("url", "s3://bucket/db")
        .option("key", "id")                            # the key column(s), comma-separated
        .option("start", "100").option("end", "200")    # optional key range of the first
        .load()                                         # key column; or .option("prefix", ..)
    )

The scan reads one snapshot: planning pins the newest manifest and its WAL prefix with a
snapshot that expires after ``snapshotTtl`` seconds (``slatepy.engine.pinned``), and splits
the key range into partitions along the manifest's SST boundaries (at most
``maxPartitions``). Each task reads its range of that same view and returns Arrow batches.
A clone (RFC 0017) reads like any database: the SSTs it shares are read from its source.

Options (names are case-insensitive, values strings):

* ``url`` (or the ``load(path)`` argument): the database; a plain path is a local one.
* ``key``, ``value``: the row codec (``slatepy.spark.codec``). Without a schema the rows are
  those of the recorded layout, else ``key binary, value binary``, the raw bytes.
* ``start``, ``end``, ``prefix``: a key range, as values of the first key column.
* ``maxPartitions`` (default 64), ``snapshotTtl`` (seconds, default 3600): reads only.
* ``targetSstBytes`` (default 64 MiB): writes only, the size the tasks cut SSTs at.
* ``createIfMissing`` (default ``true``): writes only; ``false`` refuses a missing database.
* ``bufferBytes`` (default 256 MiB): writes only, the rows a task buffers before it spills a
  sorted run to its local temporary directory (``slatepy.spark.spill``).

Filters are not pushed down: PySpark 4.3 keeps the reader that ``pushFilters`` narrowed with
the DataFrame and reuses it for later plans without filters, so ``df.where(...).count()``
then ``df.count()`` would return the filtered count (RFC 0016, "Pushdown"). Key ranges come
from options, which are part of the relation. Spark still applies every ``where`` itself.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from slatepy.config import Settings, resolve_settings
from slatepy.engine.db import Db
from slatepy.engine.ingest import delete_ingest_ssts, publish_ingest, write_ingest_columns
from slatepy.engine.pinned import (
    PinnedSnapshot,
    open_pinned_store,
    pin_snapshot,
    scan_pinned,
    split_points,
)
from slatepy.errors import InvalidArgument, NotFound
from slatepy.gc.rules import referenced_ssts
from slatepy.manifest.record import SstHandle
from slatepy.manifest.store import ManifestStore
from slatepy.spark.cleanup import commit_never_ran, left_to_gc
from slatepy.spark.codec import Column, RowCodec, prefix_end
from slatepy.spark.columns import binary_columns
from slatepy.spark.registration import register_kv_database
from slatepy.spark.spill import SortedSpill
from slatepy.spark.table import TABLE_PATH, TableLayout, read_layout, write_layout
from slatepy.store.stack import open_stack

DEFAULT_SCHEMA = "key binary, value binary"
BATCH_ROWS = 8192

READ_OPTIONS = frozenset(
    {"url", "path", "key", "value", "start", "end", "prefix", "maxpartitions", "snapshotttl"}
    | {"settings"}
)
"""Every option a read accepts, lowercased (Spark stores them so; ``path`` is ``load``'s)."""

WRITE_OPTIONS = frozenset(
    {"url", "path", "key", "value", "targetsstbytes", "createifmissing", "bufferbytes", "settings"}
    | {"catalog"}
)
"""Every option a bulk load accepts, lowercased (``path`` is ``save``'s)."""

DEFAULT_TARGET_SST_BYTES = 64 * 1024 * 1024
DEFAULT_BUFFER_BYTES = 256 * 1024 * 1024
"""A load task's row buffer (estimated bytes) before it spills a sorted run to local disk."""


def options_of(options: Mapping[str, str], allowed: frozenset[str]) -> dict[str, str]:
    """The options lowercased, refusing unknown ones (a typo must not be ignored)."""
    lowered = {k.lower(): v for k, v in options.items()}
    unknown = sorted(set(lowered) - allowed)
    if unknown:
        raise InvalidArgument(
            f"unknown option(s) {unknown} for the slatepy source; known: {sorted(allowed)}"
        )
    return lowered


def url_of(options: Mapping[str, str]) -> str:
    """The ``url`` option, or the ``load``/``save`` path."""
    url, path = options.get("url"), options.get("path")
    if url and path and url != path:
        raise InvalidArgument(f"option 'url' ({url!r}) and the path ({path!r}) disagree")
    found = url or path
    if not found:
        raise InvalidArgument("option 'url' is required: the database's URL")
    return plain_path_url(found)


def plain_path_url(url: str) -> str:
    """``url``, with a plain path (``/data/db``, ``data/db``) as an absolute ``file://``
    URL (resolved on the driver, where options are checked)."""
    if "://" in url:
        return url
    return "file://" + os.path.abspath(url)


def key_option(options: Mapping[str, str]) -> list[str]:
    return [name.strip() for name in options.get("key", "").split(",") if name.strip()]


def columns_of_schema(schema: StructType) -> list[Column]:
    return [Column(f.name, f.dataType.typeName(), f.nullable) for f in schema.fields]


def _number(options: Mapping[str, str], name: str, default: float, *, least: float) -> float:
    text = options.get(name.lower())
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgument(f"option '{name}': {text!r} is not a number") from None
    if value < least:
        raise InvalidArgument(f"option '{name}': must be >= {least}, got {text}")
    return value


class KvDataSource(DataSource):
    """``spark.read.format("slatepy")`` (and, with the bulk load, ``df.write``)."""

    @classmethod
    def name(cls) -> str:
        return "slatepy"

    def schema(self) -> str:
        """The layout the last bulk load recorded (``slatepy.spark.table``), else the raw
        ``key binary, value binary``."""
        options = options_of(self.options, READ_OPTIONS)
        layout = recorded_layout(url_of(options), resolve_settings(options.get("settings")))
        if layout is not None:
            return layout.ddl()
        if "key" in options or "value" in options:
            raise InvalidArgument(
                "option 'key'/'value' needs the row schema: no bulk load recorded one "
                f"({TABLE_PATH}), so give it with .schema('id long, name string, ...'); "
                f"without a schema and these options the rows are `{DEFAULT_SCHEMA}`"
            )
        return DEFAULT_SCHEMA

    def reader(self, schema: StructType) -> KvReader:
        return KvReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> KvWriter:
        return KvWriter(self.options, schema, overwrite=overwrite)


@dataclass(frozen=True)
class KvPartition(InputPartition):
    """One task's share of a read: a key range of the pinned view."""

    pinned: PinnedSnapshot
    start: bytes
    end: bytes | None


class KvReader(DataSourceReader):
    """Plans a scan of one pinned snapshot and reads its partitions as Arrow batches.

    Everything is validated here, on the driver, before any task runs. Holds only options
    and the codec, so it pickles small.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        opts = options_of(options, READ_OPTIONS)
        self.url = url_of(opts)
        # Resolved on the driver (option "settings": a TOML path; then SLATEPY_*) and
        # shipped to the executors with this object.
        self.settings = resolve_settings(opts.get("settings"))
        columns = columns_of_schema(schema)
        layout = recorded_layout(self.url, self.settings)
        self.stored = None if layout is None else layout.describe()
        value = opts.get("value")
        if layout is not None and "key" not in opts and value is None:
            key, value = list(layout.key), layout.value
        else:
            key = key_option(opts) or ["key"]
            names = [f.name for f in schema.fields]
            if "key" not in opts and value is None and names == ["key", "value"]:
                value = "value"  # the raw default schema
        if layout is not None:
            layout.check(columns, key, value)  # an explicit schema wins unless it conflicts
        self.codec = RowCodec.of(columns, key, value)
        self.max_partitions = int(_number(opts, "maxPartitions", 64, least=1))
        self.ttl = _number(opts, "snapshotTtl", 3600.0, least=1)
        self.start, self.end = self._range(opts)

    def _range(self, opts: Mapping[str, str]) -> tuple[bytes, bytes | None]:
        start = b"" if "start" not in opts else self.codec.encode_bound(opts["start"], "start")
        end = None if "end" not in opts else self.codec.encode_bound(opts["end"], "end")
        if "prefix" in opts:
            prefix = self.codec.encode_bound(opts["prefix"], "prefix", prefix=True)
            start = max(start, prefix)
            upper = prefix_end(prefix)
            if upper is not None:
                end = upper if end is None else min(end, upper)
        return start, end

    def partitions(self) -> list[KvPartition]:
        settings = self.settings
        store = open_pinned_store(self.url, settings)  # a clone: reads its shared SSTs too
        try:
            pinned, manifest = pin_snapshot(store, settings, ttl=self.ttl)
        finally:
            store.drain()
        if self.end is not None and self.end <= self.start:
            return [KvPartition(pinned, self.start, self.start)]  # empty: Spark wants one
        cuts = split_points(manifest, self.start, self.end, max_parts=self.max_partitions)
        bounds: list[bytes | None] = [self.start, *cuts, self.end]
        return [
            KvPartition(pinned, lo, hi) for lo, hi in itertools.pairwise(bounds) if lo is not None
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, KvPartition):
            raise TypeError(f"not a slatepy partition: {partition!r}")
        if partition.end is not None and partition.end <= partition.start:
            return
        settings = self.settings
        store = open_pinned_store(self.url, settings)
        schema = self.codec.arrow_schema()
        try:
            pairs: list[tuple[bytes, bytes]] = []
            for pair in scan_pinned(
                store, settings, partition.pinned, partition.start, partition.end
            ):
                pairs.append(pair)
                if len(pairs) == BATCH_ROWS:
                    yield self._batch(pairs, schema)
                    pairs = []
            if pairs:
                yield self._batch(pairs, schema)
        finally:
            store.drain()

    def _batch(self, pairs: list[tuple[bytes, bytes]], schema: Any) -> Any:
        try:
            return self.codec.to_batch(pairs, schema)
        except InvalidArgument as exc:
            stored = (
                f"the recorded layout is {self.stored}"
                if self.stored
                else f"no load recorded a layout ({TABLE_PATH})"
            )
            raise InvalidArgument(f"{exc}; {stored}") from exc


def recorded_layout(url: str, settings: Settings) -> TableLayout | None:
    """The layout recorded at ``url`` (None: none, or no database)."""
    store = open_stack(url, settings)
    try:
        return read_layout(store)
    finally:
        store.drain()


@dataclass(frozen=True)
class KvCommitMessage(WriterCommitMessage):
    """What one task wrote: its SSTs, not yet part of the database."""

    handles: tuple[SstHandle, ...]


class KvWriter(DataSourceArrowWriter):
    """The bulk load: tasks write sorted SSTs, the driver publishes them in one ingestion.

    ``df.write.format("slatepy").option("url", URL).option("key", "id").mode("append")
    .save()``. Each task encodes *all* its rows (so a bad row fails the task before it
    writes anything), sorts them by key, keeps the last row of equal keys, and writes SSTs
    straight to the store (no WAL, no memtable; ``engine.ingest``). ``commit`` publishes
    every task's SSTs in one manifest update: the loaded keys are newer than every write
    acknowledged before it and older than every write after it. ``abort`` deletes what the
    successful tasks reported only when a task failed (no commit ran); after a failed
    commit it deletes nothing, since the publish may have landed. Every unreferenced SST
    (those, and what failed attempts wrote) is deleted by GC after ``gc_min_age``.
    A task buffers up to ``bufferBytes`` of rows and spills sorted runs to local disk past
    that (``slatepy.spark.spill``); ``repartitionByRange(n, key)`` makes the SSTs of
    different tasks disjoint.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, *, overwrite: bool) -> None:
        if overwrite:
            raise InvalidArgument(
                "the slatepy source only appends: use .mode('append') (a load never deletes "
                "keys it does not write)"
            )
        opts = options_of(options, WRITE_OPTIONS)
        self.url = url_of(opts)
        # Resolved on the driver (option "settings": a TOML path; then SLATEPY_*) and
        # shipped to the executors with this object.
        self.settings = resolve_settings(opts.get("settings"))
        columns = columns_of_schema(schema)
        self.codec = RowCodec.of(columns, key_option(opts), opts.get("value"))
        self.layout = TableLayout(tuple(columns), tuple(key_option(opts)), opts.get("value"))
        self.target_sst_bytes = int(
            _number(opts, "targetSstBytes", DEFAULT_TARGET_SST_BYTES, least=4096)
        )
        self.buffer_bytes = int(_number(opts, "bufferBytes", DEFAULT_BUFFER_BYTES, least=64 * 1024))
        create = opts.get("createifmissing", "true").lower()
        if create not in ("true", "false"):
            raise InvalidArgument(f"option 'createIfMissing': true or false, not {create!r}")
        if "catalog" in opts:  # before the database is made or written (RFC 0028 Addendum C)
            register_kv_database(opts["catalog"], self.url)
        # On the driver, before any task runs: the database exists (created as Db.open
        # does, unless createIfMissing is false) and the layout agrees with the recorded one.
        settings = self.settings
        try:
            missing = ManifestStore(open_stack(self.url, settings)).load() is None
        except NotFound:
            missing = True
        if missing and create == "false":
            raise NotFound(
                f"option 'url': no slatepy database at {self.url} (createIfMissing is false)",
                path="manifest/",
            )
        if missing:
            Db.open(self.url, settings=msgspec.structs.replace(settings, compactor="off")).close()
        recorded = recorded_layout(self.url, settings)
        if recorded is not None:
            recorded.check(columns, self.layout.key, self.layout.value)

    def write(self, iterator: Iterator[Any]) -> KvCommitMessage:
        settings = self.settings
        with SortedSpill(self.buffer_bytes) as rows:
            for batch in iterator:
                rows.add(*binary_columns(self.codec, batch))
            store = open_stack(self.url, settings)
            try:
                handles = write_ingest_columns(
                    store, rows.sorted_pairs(), settings, target_sst_bytes=self.target_sst_bytes
                )
            finally:
                store.drain()
        return KvCommitMessage(tuple(handles))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        handles = [h for m in messages if isinstance(m, KvCommitMessage) for h in m.handles]
        settings = self.settings
        store = open_stack(self.url, settings)
        try:
            if handles:  # (an empty DataFrame: nothing to publish)
                publish_ingest(store, settings, handles)
            recorded = read_layout(store)
            known = set() if recorded is None else {c.name for c in recorded.columns}
            columns = (
                self.layout.columns
                if recorded is None
                else (*recorded.columns, *(c for c in self.layout.columns if c.name not in known))
            )
            write_layout(store, dataclasses.replace(self.layout, columns=columns))
        finally:
            store.drain()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Delete the SSTs of a load whose commit never ran (a task failed); after a commit
        ran, delete nothing: its publish may have landed (``slatepy.spark.cleanup``)."""
        handles = [h for m in messages if isinstance(m, KvCommitMessage) for h in m.handles]
        if not commit_never_ran(messages):
            left_to_gc(f"bulk load into {self.url}", len(handles), "GC (after gc_min_age)")
            return
        if not handles:
            return
        settings = self.settings
        store = open_stack(self.url, settings)
        try:
            loaded = ManifestStore(store).load()  # belt and braces: none can be referenced
            referenced = referenced_ssts([loaded.manifest]) if loaded is not None else set()
            delete_ingest_ssts(store, [h for h in handles if h.id not in referenced])
        finally:
            store.drain()
