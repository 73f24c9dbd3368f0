"""Compaction outputs are cut at ``target_sst_bytes`` whatever the plan (RFC 0011).

A WalToL0 over a large WAL tail writes several L0 SSTs with disjoint key ranges instead of
one SST the size of the tail built in memory; reads and the next L0ToRun treat them like any
other L0 SSTs.
"""

from __future__ import annotations

from itertools import pairwise

import pytest

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.compactor.planner import WalToL0
from slatepy.errors import StoreUnavailable
from slatepy.store import ObjectStore, open_store
from slatepy.store.base import ObjectWriter, PutData, WrappingStore
from slatepy.table import sst_output

QUIET = Settings(flush_interval=60, block_size=512, compactor="off")
POLICY = CompactionPolicy(l0_trigger=100, max_wal_ssts=1000, target_sst_bytes=8 * 1024)


def write(db: Db, first: int, count: int, tag: bytes) -> None:
    batch = WriteBatch()
    for i in range(first, first + count):
        batch.put(b"k%05d" % i, tag * 20)
    db.write(batch)


def test_a_large_wal_to_l0_writes_several_disjoint_l0_ssts() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=QUIET) as db:
        for first in range(0, 2000, 200):  # older values everywhere
            write(db, first, 200, b"a")
        compactor = Compactor(store, settings=QUIET, policy=POLICY)
        assert isinstance(compactor.run_once(), WalToL0)
        old_l0 = compactor.last_published.manifest.l0
        assert len(old_l0) > 3
        for first in range(500, 1500, 250):  # newer values over the middle
            write(db, first, 250, b"b")
        assert isinstance(compactor.run_once(), WalToL0)
        l0 = compactor.last_published.manifest.l0
        new_l0 = l0[: len(l0) - len(old_l0)]
        assert l0[len(new_l0) :] == old_l0  # the newer outputs come first
        for ssts in (old_l0, new_l0):
            assert all(h.object_size < 2 * POLICY.target_sst_bytes for h in ssts)
            # Disjoint, increasing key ranges: a key is in at most one of one plan's outputs.
            assert all(a.last_key < b.first_key for a, b in pairwise(ssts))
        assert sum(h.entry_count for h in new_l0) == 1000

    def expected(i: int) -> bytes:
        return (b"b" if 500 <= i < 1500 else b"a") * 20

    with Db.open(store, settings=QUIET) as db:  # the reads come from the L0 SSTs now
        assert db.replayed_ssts == 0
        for i in range(0, 2000, 7):
            assert db.get(b"k%05d" % i) == expected(i)
        assert list(db.scan()) == [(b"k%05d" % i, expected(i)) for i in range(2000)]

    merge = Compactor(
        store, settings=QUIET, policy=CompactionPolicy(l0_trigger=2, target_sst_bytes=8 * 1024)
    )
    merge.run_until_idle()  # the reopen's fencing WAL SSTs, then all of L0 into a run
    manifest = merge.last_published.manifest
    assert manifest.l0 == () and len(manifest.sorted_runs) == 1
    with Db.open(store, settings=QUIET) as db:
        assert list(db.scan()) == [(b"k%05d" % i, expected(i)) for i in range(2000)]
        assert db.get(b"k00777") == expected(777) and db.get(b"k00100") == expected(100)


class RecordedStreams(WrappingStore):
    """Streams writes to the store below, recording the size of every piece sent per path;
    with ``fail_at`` the stream's n-th piece fails (the store went away mid-upload)."""

    def __init__(self, inner: ObjectStore, fail_at: int | None = None) -> None:
        super().__init__(inner)
        self.pieces: dict[str, list[int]] = {}
        self.aborted: list[str] = []
        self.fail_at = fail_at

    def open_writer(self, path: str) -> ObjectWriter:
        return _Recording(self, path, self.inner.open_writer(path))


class _Recording(ObjectWriter):
    def __init__(self, store: RecordedStreams, path: str, inner: ObjectWriter) -> None:
        self.store, self.path, self.inner = store, path, inner
        self.sizes = store.pieces.setdefault(path, [])

    def write(self, data: PutData) -> None:
        self.sizes.append(len(data))
        if self.store.fail_at == len(self.sizes):
            raise StoreUnavailable(f"injected: stream of {self.path} broke", path=self.path)
        self.inner.write(data)

    def commit(self) -> None:
        self.inner.commit()

    def abort(self) -> None:
        self.store.aborted.append(self.path)
        self.inner.abort()

    @property
    def requests(self) -> int:
        return self.inner.requests


def fill(store: ObjectStore, keys: int) -> None:
    with Db.open(store, settings=QUIET) as db:
        for first in range(0, keys, 500):
            write(db, first, 500, b"a")


def test_compaction_outputs_are_streamed_in_bounded_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An output SST is sent while it is built, ``SEND_BYTES`` at a time, so compaction
    memory holds about one piece, not the SST (the peak RSS of issue 18)."""
    monkeypatch.setattr(sst_output, "SEND_BYTES", 16 * 1024)
    store = RecordedStreams(open_store("memory://"))
    fill(store, 8000)  # over two outputs' worth of (columnar, RFC 0022) blocks
    policy = CompactionPolicy(l0_trigger=100, target_sst_bytes=128 * 1024)
    Compactor(store, settings=QUIET, policy=policy).run_until_idle()
    outputs = {p: s for p, s in store.pieces.items() if p.startswith("compacted/")}
    # Whole data blocks, sent once 16 KiB are buffered (checked every YIELD_EVERY entries,
    # or after a bulk extend: up to about 23 KiB of these small entries with their lookup
    # indexes past the 16 KiB), then the tail (index, footer).
    assert max(max(sizes) for sizes in outputs.values()) < 3 * 16 * 1024
    large = [sizes for sizes in outputs.values() if sum(sizes) > 100 * 1024]
    assert len(large) >= 2 and all(len(sizes) >= 4 for sizes in large)
    with Db.open(store, settings=QUIET) as db:
        assert db.replayed_ssts == 0
        assert list(db.scan()) == [(b"k%05d" % i, b"a" * 20) for i in range(8000)]


def test_a_broken_output_stream_aborts_and_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sst_output, "SEND_BYTES", 16 * 1024)
    memory = open_store("memory://")
    fill(memory, 6000)
    broken = RecordedStreams(memory, fail_at=3)
    policy = CompactionPolicy(l0_trigger=100, target_sst_bytes=128 * 1024)
    with pytest.raises(StoreUnavailable, match="injected"):
        Compactor(broken, settings=QUIET, policy=policy).run_once()
    assert len(broken.aborted) == 1
    assert memory.list("compacted/") == []  # the aborted output never became visible
    Compactor(memory, settings=QUIET, policy=policy).run_until_idle()
    with Db.open(memory, settings=QUIET) as db:
        assert list(db.scan()) == [(b"k%05d" % i, b"a" * 20) for i in range(6000)]
