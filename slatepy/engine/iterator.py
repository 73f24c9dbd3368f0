"""Ordered reads over one consistent view, forward or reverse, a block of rows at a time.

A view is the memtable's entries (a frozen list), over the compacted SSTs one manifest names.
Each source (the memtable, every L0 SST, every sorted run) yields its entries in scan order as
column chunks (:data:`~slatepy.table.grouping.Columns`: a block's keys, seqs and values as
parallel lists), and :func:`merge_columns` merges them a *window* at a time: up to the
nearest chunk end among the sources, every source's entries are final, so the window's
versions of each key are all present and can be resolved together. A window that only one
source contributes to (the common case: a compacted database, or sources with disjoint
key ranges) passes through untouched; otherwise its rows are sorted by ``(key, seq, source)``
in C and the newest version of each key kept with a dict. Per-row Python work is only the
tombstone filter (:func:`live_columns`), which is why :func:`batches` (``scan_batches``) can
beat a row-at-a-time scan (RFC 0020).

Visibility lives in two functions, and only there: :func:`resolve_window` decides which
version of a key a window of *several* sources yields (the newest, a tombstone too; merge
operands folded over the older ones), and :func:`live_columns` decides, for *every* resolved
row, what a reader sees (not tombstones, nothing under a range tombstone, nothing expired:
RFC 0019's kinds, through :func:`slatepy.table.visibility.live_entries`).
A window that only one source contributes to skips :func:`resolve_window` (each source holds
one version per key) and goes straight to :func:`live_columns`, so a per-row rule (an expiry,
a lone merge operand) belongs there. Every read in this module (iterators, reverse scans,
batches, snapshots, transactions), and ``Db.scan`` (:func:`slatepy.engine.view.scan_merged`),
goes through both; they live in :mod:`slatepy.engine.columns`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal

from slatepy.engine.batch import check_key
from slatepy.engine.columns import (
    _FIRST,
    MEMTABLE_CHUNK,
    Kinds,
    LiveColumns,
    Rows,
    live_columns,
    live_rows,
    memtable_columns,
    merge_columns,
    resolve_window,
)
from slatepy.engine.view import compacted_sources, scan_ranges
from slatepy.errors import InvalidArgument
from slatepy.format.block import Entry
from slatepy.manifest.record import Manifest
from slatepy.table.grouping import Columns
from slatepy.table.merge_operator import NO_MERGING, Merging
from slatepy.table.reader import TableReader
from slatepy.table.visibility import EMPTY, Clock, RangeIndex, folding, frozen_clock

__all__ = [
    "MEMTABLE_CHUNK",
    "Kinds",
    "LiveColumns",
    "compacted_sources",
    "live_columns",
    "memtable_columns",
    "merge_columns",
    "resolve_window",
]

DEFAULT_BATCH_SIZE = 1024
BatchFormat = Literal["rows", "columns", "arrow"]


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def key_bounds(
    start: bytes | None, end: bytes | None, prefix: bytes | None
) -> tuple[bytes, bytes | None]:
    """``[start, end)`` intersected with the keys starting with ``prefix``.

    Raises:
        InvalidArgument: a bound is not bytes, or ``start`` is after ``end``.
    """
    lo = b"" if start is None else start
    hi = end
    if not isinstance(lo, bytes) or not (hi is None or isinstance(hi, bytes)):
        raise InvalidArgument("scan bounds must be bytes (or None)")
    if prefix is not None:
        if not isinstance(prefix, bytes):
            raise InvalidArgument(f"prefix must be bytes, got {type(prefix).__name__}")
        lo = max(lo, prefix)
        p_end = prefix_end(prefix)
        if p_end is not None:
            hi = p_end if hi is None else min(hi, p_end)
    if hi is not None and hi < lo:
        if prefix is not None:
            hi = lo  # a prefix outside [start, end): an empty range, not a caller error
        else:
            raise InvalidArgument(f"scan start {lo!r} is after end {hi!r}")
    return lo, hi


@dataclass(slots=True)
class View:
    """One consistent read view: frozen memtable entries over a manifest's SSTs.

    ``entries`` are the memtable's entries of ``[start, end)`` (tombstones included), taken
    when the view was, with ``ranges``, the memtable's range tombstones then; they are never
    changed, so a view can be re-read (an iterator's seek) and always gives the same state,
    for as long as the manifest's SSTs exist. Its ``clock`` is stopped when it is made, so
    TTL expiry is judged once for the whole view.
    """

    tables: TableReader
    manifest: Manifest
    entries: list[Entry]
    start: bytes
    end: bytes | None
    ranges: RangeIndex = EMPTY
    clock: Clock = time.time
    merging: Merging = NO_MERGING

    def __post_init__(self) -> None:
        # One view, one clock: expiry is judged as of when the view was taken, for every
        # chunk, every seek and either direction (issue 29), as a snapshot judges it.
        self.clock = frozen_clock(self.clock)
        self.merging = self.merging.at(self.clock)  # a TTL'd base folded over: same clock

    def kinds(self, start: bytes, end: bytes | None) -> Kinds:
        """The range tombstones over ``[start, end)`` (the memtable's and the manifest's)
        with the view's clock and merge operator."""
        return Kinds(scan_ranges(self.ranges, self.manifest, start, end), self.clock, self.merging)

    def columns(self, start: bytes, end: bytes | None, reverse: bool) -> Iterator[Columns]:
        """Resolved versions (tombstones included) of ``[start, end)`` within the view."""
        start = max(start, self.start)
        if self.end is not None:
            end = self.end if end is None else min(end, self.end)
        if end is not None and end <= start:
            return iter(())
        entries = self.entries
        lo = bisect_left(entries, start, key=_FIRST)
        hi = len(entries) if end is None else bisect_left(entries, end, lo, key=_FIRST)
        sources = compacted_sources(self.tables, self.manifest, start, end, reverse)
        if hi > lo:
            sources.insert(0, memtable_columns(entries[lo:hi], reverse))
        kinds = self.kinds(start, end)
        return merge_columns(sources, reverse, folding(kinds.ranges, self.merging, complete=True))

    def live(self, start: bytes, end: bytes | None, reverse: bool) -> Iterator[LiveColumns]:
        """Live ``(keys, values)`` chunks of ``[start, end)`` in scan order."""
        kinds = self.kinds(start, end)
        for columns in self.columns(start, end, reverse):
            keys, values = live_columns(columns, kinds)
            if keys:
                yield keys, values

    def rows(self, start: bytes, end: bytes | None, reverse: bool) -> Rows:
        """Live ``(key, value)`` rows of ``[start, end)`` in scan order, iterated in C."""
        return live_rows(self.live(start, end, reverse))


def batches(chunks: Iterator[LiveColumns], batch_size: int, fmt: BatchFormat) -> Iterator[Any]:
    """Re-cut live chunks into batches of ``batch_size`` rows (the last may be shorter):
    lists of ``(key, value)`` (``"rows"``), ``(keys, values)`` lists (``"columns"``: no
    per-row object at all), or pyarrow ``RecordBatch``es of binary ``key`` and ``value``."""
    emit: Callable[[list[bytes], list[bytes]], Any]
    if fmt == "rows":
        yield from _row_batches(live_rows(chunks), batch_size)
        return
    if fmt == "arrow":
        emit = _arrow_emitter()
    else:

        def emit(keys: list[bytes], values: list[bytes]) -> Any:
            return keys, values

    pend_k: list[bytes] = []
    pend_v: list[bytes] = []
    for keys, values in chunks:
        if not pend_k and len(keys) == batch_size:
            yield emit(list(keys), list(values))
            continue
        pend_k += keys
        pend_v += values
        while len(pend_k) >= batch_size:
            yield emit(pend_k[:batch_size], pend_v[:batch_size])
            del pend_k[:batch_size], pend_v[:batch_size]
    if pend_k:
        yield emit(pend_k, pend_v)


def _row_batches(rows: Rows, batch_size: int) -> Iterator[list[tuple[bytes, bytes]]]:
    """Lists of ``batch_size`` rows, each taken from the chained zips in C (``islice``)."""
    try:
        while batch := list(islice(rows, batch_size)):
            yield batch
    finally:
        rows.close()


def _arrow_emitter() -> Callable[[list[bytes], list[bytes]], Any]:
    """Builds each ``RecordBatch`` from the two lists (pyarrow converts them in C; measured
    faster than joining the bytes and building offsets by hand)."""
    pa = _pyarrow()
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary())])

    def emit(keys: list[bytes], values: list[bytes]) -> Any:
        return pa.RecordBatch.from_arrays(
            [pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=schema
        )

    return emit


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as exc:
        raise InvalidArgument(
            'format="arrow" needs pyarrow: pip install pyarrow (or use format="columns")'
        ) from exc
    return pyarrow


def check_batch_size(batch_size: object) -> int:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidArgument(f"batch_size must be a positive int, got {batch_size!r}")
    return batch_size


def check_limit(limit: object) -> int | None:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise InvalidArgument(f"limit must be a non-negative int or None, got {limit!r}")
    return limit


def limited(rows: Iterator[tuple[bytes, bytes]], limit: int | None) -> Iterator[Any]:
    return rows if limit is None else islice(rows, limit)


class DbIterator:
    """An ordered cursor over one consistent view; iterate it for ``(key, value)`` pairs.

    Created by ``Db.iter``/``DbReader.iter``/``Snapshot.iter``. :meth:`seek` repositions it
    within its bounds, on the same view (later writes stay invisible to it).
    """

    def __init__(self, view: View, start: bytes, end: bytes | None, *, reverse: bool) -> None:
        self._view = view
        self._start = start
        self._end = end
        self._reverse = reverse
        self._rows: Iterator[tuple[bytes, bytes]] = view.rows(start, end, reverse)

    @property
    def reverse(self) -> bool:
        return self._reverse

    def __iter__(self) -> DbIterator:
        return self

    def __next__(self) -> tuple[bytes, bytes]:
        return next(self._rows)

    def seek(self, key: bytes) -> None:
        """Reposition: the next pair is the first with a key >= ``key`` (going forward), or
        <= ``key`` (in reverse), within the iterator's bounds."""
        key = check_key(key)
        self._close_rows()
        if self._reverse:
            hi = key + b"\x00"  # the smallest key after ``key``
            if self._end is not None:
                hi = min(hi, self._end)
            self._rows = self._view.rows(self._start, hi, True)
        else:
            self._rows = self._view.rows(max(key, self._start), self._end, False)

    def close(self) -> None:
        """Stop reading (joins any read-ahead thread); iterating further yields nothing."""
        self._close_rows()
        self._rows = iter(())

    def _close_rows(self) -> None:
        close = getattr(self._rows, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> DbIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rows_or_batches(
    view: View,
    start: bytes,
    end: bytes | None,
    *,
    reverse: bool,
    batch_size: int,
    fmt: object,
) -> Iterator[Any]:
    """Validated ``scan_batches``: batches of the view's live rows of ``[start, end)``."""
    if fmt not in ("rows", "columns", "arrow"):
        raise InvalidArgument(f'format must be "rows", "columns" or "arrow", got {fmt!r}')
    size = check_batch_size(batch_size)
    if fmt == "arrow":
        _pyarrow()  # fail at the call, not at the first next()
    return batches(view.live(start, end, reverse), size, fmt)
