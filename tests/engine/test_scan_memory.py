"""A merged scan's sources share one scan's read-ahead (issue 33 item 4): each source of a
scan over several L0 SSTs and runs reads chunks of at most its share of
``scan_read_ahead_bytes``, so the scan holds about ``scan_requests_in_flight + 1`` chunks'
worth whatever the number of sources, not that much per source."""

from __future__ import annotations

from slatepy import Db, DbReader, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.store import ObjectStore, open_store
from slatepy.store.base import WrappingStore

READ_AHEAD = 1024 * 1024


class RangeSizes(WrappingStore):
    """Records the length of every ranged GET of a compacted SST."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.sizes: list[int] = []

    def get_range(self, path: str, start: int, end: int) -> bytes:
        if path.startswith("compacted/"):
            self.sizes.append(end - start)
        return self.inner.get_range(path, start, end)


def build(store: ObjectStore, ssts: int, keys: int) -> None:
    """``ssts`` overlapping L0 SSTs of ``keys`` keys each (about 1.4 MB each)."""
    off = Settings(compactor="off", flush_interval=60)
    keep = CompactionPolicy(l0_trigger=100, l0_max=100)
    with Db.open(store, settings=off) as db:
        compactor = Compactor(store, settings=off, policy=keep)
        for sst in range(ssts):
            for first in range(sst, keys * ssts, 1000 * ssts):
                batch = WriteBatch()
                for i in range(first, min(first + 1000 * ssts, keys * ssts), ssts):
                    batch.put(b"key%08d" % i, b"%03d" % sst + b"v" * 97)
                db.write(batch)
            compactor.run_until_idle()


def scanned_sizes(store: RangeSizes, ssts: int, keys: int) -> list[int]:
    settings = Settings(compactor="off", scan_read_ahead_bytes=READ_AHEAD)
    with DbReader.open(store, settings=settings) as reader:
        assert len(reader._view.l0) == ssts
        store.sizes.clear()
        rows = list(reader.scan())
        assert len(rows) == keys * ssts
        assert all(value[:3] == b"%03d" % (int(key[3:]) % ssts) for key, value in rows)
    return list(store.sizes)


def test_the_sources_of_a_merged_scan_share_its_read_ahead() -> None:
    store = RangeSizes(open_store("memory://"))
    build(store, 4, 10_000)
    sizes = scanned_sizes(store, 4, 10_000)
    # A quarter of the read-ahead each (a chunk ends at a block boundary: one block more at
    # most); a source's chunks still grow to its share.
    assert max(sizes) <= READ_AHEAD // 4 + 8 * 1024
    assert max(sizes) > READ_AHEAD // 8


def test_a_single_source_reads_ahead_in_full() -> None:
    store = RangeSizes(open_store("memory://"))
    build(store, 1, 40_000)
    assert max(scanned_sizes(store, 1, 40_000)) > READ_AHEAD // 2
