"""TableReader.scan_columns: block columns forward and reverse, bounds exact, across many
blocks and index partitions, reading backwards in a few growing chunks (RFC 0020)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slatepy.format.block import Entry
from slatepy.format.sst import SstBuilder
from slatepy.store import MetricsStore, open_store
from slatepy.table.grouping import Columns
from slatepy.table.reader import TableReader

ENTRIES = [(b"key%05d" % i, i + 1, None if i % 7 == 0 else b"v" * 40) for i in range(5000)]


def store_with_sst() -> MetricsStore:
    store = MetricsStore(open_store("memory://"))
    builder = SstBuilder(writer_epoch=1, block_size=512)
    builder.add_all(ENTRIES)
    encoded = builder.finish()
    assert encoded.meta.props.block_count > 300
    store.put("t.sst", encoded.data)
    return store


STORE = store_with_sst()


def flat(chunks: list[Columns]) -> list[Entry]:
    return [e for keys, seqs, values in chunks for e in zip(keys, seqs, values, strict=True)]


def test_a_whole_reverse_scan_reads_few_ranges() -> None:
    reader = TableReader(STORE)
    top = reader.top("t.sst")
    assert top.partition_count > 3
    STORE.metrics.reset()
    assert flat(list(reader.scan_columns("t.sst", b"", None, reverse=True))) == ENTRIES[::-1]
    assert STORE.metrics.requests("get_range") <= 12
    assert flat(list(reader.scan_columns("t.sst", b"", None))) == ENTRIES


@given(lo=st.integers(0, 5100), width=st.integers(0, 800), reverse=st.booleans())
def test_bounds_are_exact_both_ways(lo: int, width: int, reverse: bool) -> None:
    start, end = b"key%05d" % lo, b"key%05d" % (lo + width)
    want = [e for e in ENTRIES if start <= e[0] < end]
    got = flat(list(TableReader(STORE).scan_columns("t.sst", start, end, reverse=reverse)))
    assert got == (want[::-1] if reverse else want)


def test_bounds_between_keys() -> None:
    reader = TableReader(STORE)
    got = flat(list(reader.scan_columns("t.sst", b"key00100x", b"key00200x", reverse=True)))
    assert got == [e for e in ENTRIES if b"key00101" <= e[0] <= b"key00200"][::-1]
    assert flat(list(reader.scan_columns("t.sst", b"a", b"key00000", reverse=True))) == []
    assert flat(list(reader.scan_columns("t.sst", b"z", None, reverse=True))) == []
