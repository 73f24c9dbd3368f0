"""Scans hand on columns a group of blocks at a time (RFC 0022): same rows, in order, with
values known plain only when they are."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.engine.columns import Kinds, Rows, live_columns
from slatepy.format.block import PlainValues
from slatepy.format.columnar import ColumnBlockBuilder, decode_columnar
from slatepy.format.kinds import Expiring, RangeTombstone
from slatepy.format.sst import SstBuilder
from slatepy.store import open_store
from slatepy.table.grouping import GROUP_ROWS, Piece, grouped
from slatepy.table.reader import TableReader
from slatepy.table.visibility import RangeIndex

PATH = "compacted/g.sst"


def piece(first: int, n: int, plain: bool) -> Piece:
    keys = [b"k%06d" % i for i in range(first, first + n)]
    values: list[bytes | None] = [b"v%d" % i for i in range(first, first + n)]
    if not plain:
        values[0] = None
    return keys, list(range(first, first + n)), values, plain


@given(st.lists(st.tuples(st.integers(1, 300), st.booleans()), max_size=40))
def test_groups_join_pieces_in_order_and_keep_plainness_honest(
    shapes: list[tuple[int, bool]],
) -> None:
    pieces, first = [], 0
    for n, plain in shapes:
        pieces.append(piece(first, n, plain))
        first += n
    groups = list(grouped(iter(pieces)))
    for column in range(3):
        assert [x for g in groups for x in g[column]] == [x for p in pieces for x in p[column]]
    if pieces:
        assert groups[0][0] is pieces[0][0]  # the first piece goes on alone, uncopied
    assert all(len(g[0]) < 2 * GROUP_ROWS + 300 for g in groups)
    for keys, _, values in groups:
        assert keys
        if values.__class__ is PlainValues:
            assert None not in values
    if pieces and all(plain for _, plain in shapes):
        assert all(g[2].__class__ is PlainValues for g in groups)


def test_a_long_scan_hands_on_few_groups_and_a_short_one_one_block() -> None:
    rows = [(b"key%06d" % i, i + 1, b"v" * 40) for i in range(20_000)]
    data = SstBuilder(writer_epoch=1, block_size=1024).add_all(rows).finish().data
    store = open_store("memory://")
    store.put(PATH, bytes(data))
    reader = TableReader(store)
    groups = list(reader.scan_columns(PATH, b"", None))
    assert [r for g in groups for r in zip(*g, strict=True)] == rows
    blocks = reader.top(PATH).props.block_count
    assert len(groups) < blocks / 10
    assert all(g[2].__class__ is PlainValues for g in groups)
    first = next(reader.scan_columns(PATH, b"key000100", None))
    assert 0 < len(first[0]) < 40 and first[0][0] == b"key000100"
    backwards = list(reader.scan_columns(PATH, b"", None, reverse=True))
    assert [r for g in backwards for r in zip(*g, strict=True)] == rows[::-1]
    assert len(backwards) < blocks / 10


def test_decoders_mark_plain_values_and_only_them() -> None:
    builder = ColumnBlockBuilder()
    builder.add(b"a", 1, b"x")
    assert decode_columnar(builder.finish()).plain
    builder.add(b"a", 1, None)
    mixed = decode_columnar(builder.finish())
    assert not mixed.plain and mixed.values == [None]
    builder.add(b"a", 1, Expiring.make(b"x", 5))
    assert not decode_columnar(builder.finish()).plain


def test_plain_values_skip_the_tombstone_filter_but_not_range_tombstones() -> None:
    keys = [b"a", b"b", b"c"]
    values = PlainValues([b"1", b"2", b"3"])
    assert live_columns((keys, [5, 5, 5], values)) == (keys, values)
    ranges = RangeIndex([RangeTombstone(b"b", b"c", 9)])
    assert live_columns((keys, [5, 5, 5], values), Kinds(ranges)) == ([b"a", b"c"], [b"1", b"3"])


def test_a_scan_stopped_early_joins_its_read_ahead_and_scans_read_every_row() -> None:
    """``Db.scan`` and row batches come from chained zips (``columns.Rows``), not generators:
    closing one still stops the read-ahead, and every row arrives once, in order."""
    store = open_store("memory://")
    settings = Settings(compactor="off", block_size=512, flush_interval=60)
    rows = [(b"k%06d" % i, b"v%d" % i) for i in range(20_000)]
    with Db.open(store, settings=settings) as db:
        for first in range(0, len(rows), 1000):
            batch = WriteBatch()
            for key, value in rows[first : first + 1000]:
                batch.put(key, value)
            db.write(batch)
    Compactor(store, settings=settings, policy=CompactionPolicy(l0_trigger=1)).run_until_idle()
    with Db.open(store, settings=settings) as db:
        scan = db.scan()
        assert isinstance(scan, Rows)
        assert [next(scan) for _ in range(5000)] == rows[:5000]
        assert any(t.name.startswith("slatepy-read-ahead") for t in threading.enumerate())
        scan.close()  # at most the rest of the chunk in hand still comes, then nothing
        assert len(list(scan)) < GROUP_ROWS
        assert not any(t.name.startswith("slatepy-read-ahead") for t in threading.enumerate())
        assert list(db.scan()) == rows
        assert [r for b in db.scan_batches(batch_size=777) for r in b] == rows
        assert list(db.scan(b"k000100", b"k000200")) == rows[100:200]


def test_closing_the_groups_closes_their_source_even_if_it_is_still_referenced() -> None:
    closed: list[bool] = []

    def source() -> Iterator[Piece]:
        try:
            yield from (piece(100 * i, 100, True) for i in range(10))
        finally:
            closed.append(True)

    pieces = source()  # a reference kept, as a traceback or a caller may keep one
    groups = grouped(pieces)
    next(groups)
    groups.close()
    assert closed == [True]


def test_a_scan_closed_early_joins_its_read_ahead_while_its_source_is_referenced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read-ahead pool is shut down in the ``finally`` of the scan's source generator,
    which ran only when CPython freed it."""
    rows = [(b"key%06d" % i, i + 1, b"v" * 100) for i in range(40_000)]
    data = SstBuilder(writer_epoch=1, block_size=4096).add_all(rows).finish().data
    store = open_store("memory://")
    store.put(PATH, bytes(data))
    kept: list[Iterator[Piece]] = []
    stream = TableReader._stream_columns

    def keeping(self: TableReader, *args: Any, **kwargs: Any) -> Iterator[Piece]:
        kept.append(stream(self, *args, **kwargs))
        return kept[-1]

    monkeypatch.setattr(TableReader, "_stream_columns", keeping)
    scan = TableReader(store, scan_read_ahead_bytes=256 * 1024).scan_columns(PATH, b"", None)
    try:
        for _ in range(100):  # until the read-ahead runs (a chunk or two in)
            next(scan)
            if any(t.name.startswith("slatepy-read-ahead") for t in threading.enumerate()):
                break
        assert any(t.name.startswith("slatepy-read-ahead") for t in threading.enumerate())
        scan.close()
        assert not any(t.name.startswith("slatepy-read-ahead") for t in threading.enumerate())
    finally:
        for source in kept:
            source.close()  # type: ignore[attr-defined]
