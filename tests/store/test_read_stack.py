"""The read stack's wrappers after issue 33 made them direct calls: every request still
counted with its bytes, every idempotent request still retried, kept descriptors still
bounded and safe to evict under a read, errors still typed (RFC 0006, issue 33 addendum)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from slatepy.errors import InvalidArgument, NotFound, StoreUnavailable
from slatepy.store import MetricsStore, ObjectStore, open_store
from slatepy.store.base import ObjectMeta, PutData, PutMode, WrappingStore
from slatepy.store.local_read import LocalReads
from slatepy.store.retry import RetryingStore


def file_store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path}", create=True)


def test_every_read_and_write_is_counted_with_its_bytes_and_failures(tmp_path: Path) -> None:
    store = MetricsStore(file_store(tmp_path))
    store.put("compacted/a.sst", b"0123456789")
    store.put("wal/1.sst", b"abc")
    assert store.get("wal/1.sst") == b"abc"
    assert store.get_range("compacted/a.sst", 2, 6) == b"2345"  # a kept descriptor
    assert store.get_range("compacted/a.sst", 8, 20) == b"89"  # cut at the end
    assert store.get_range("wal/1.sst", 0, 2) == b"ab"  # opened per read
    assert store.get_ranges("compacted/a.sst", [(0, 1), (3, 3), (9, 10)]) == [b"0", b"", b"9"]
    assert store.get_suffix("compacted/a.sst", 3) == b"789"
    assert store.head("wal/1.sst").size == 3
    assert [m.path for m in store.list("wal/")] == ["wal/1.sst"]
    store.copy("wal/1.sst", "wal/2.sst")
    store.delete("wal/2.sst")
    for failing in (
        lambda: store.get("nope"),
        lambda: store.get_range("compacted/nope.sst", 0, 1),
        lambda: store.get_ranges("compacted/nope.sst", [(0, 1)]),
        lambda: store.head("nope"),
    ):
        with pytest.raises(NotFound):
            failing()
    with pytest.raises(StoreUnavailable, match="starts outside"):
        store.get_range("compacted/a.sst", 10, 12)
    ops = {
        kind: (s.requests, s.errors, s.bytes_out, s.bytes_in)
        for kind, s in store.metrics.snapshot().items()
    }
    assert ops == {
        "put": (2, 0, 13, 0),
        "get": (2, 1, 0, 3),
        # 3 single ranges, 2 non-empty of the 3 asked at once, a suffix; 3 failures.
        "get_range": (9, 3, 0, 4 + 2 + 2 + 2 + 3),
        "head": (2, 1, 0, 0),
        "list": (1, 0, 0, 0),
        "copy": (1, 0, 0, 0),
        "delete": (1, 0, 0, 0),
    }


def test_reads_from_many_threads_are_all_counted(tmp_path: Path) -> None:
    store = MetricsStore(file_store(tmp_path))
    for i in range(4):
        store.put(f"compacted/{i}.sst", bytes([i]) * 8192)
    store.metrics.reset()
    errors: list[BaseException] = []

    def reader(i: int) -> None:
        try:
            for n in range(2000):
                start = n % 4096
                assert store.get_range(f"compacted/{i}.sst", start, start + 100) == bytes([i]) * 100
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    stats = store.metrics.snapshot()["get_range"]
    assert (stats.requests, stats.bytes_in) == (4 * 2000, 4 * 2000 * 100)


class FailEachOnce(WrappingStore):
    """Fails the first call of each operation with ``StoreUnavailable``, then passes them."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.calls: dict[str, int] = {}

    def _first(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        if self.calls[op] == 1:
            raise StoreUnavailable(f"connection reset ({op})", path=op)

    def get(self, path: str) -> bytes:
        self._first("get")
        return self.inner.get(path)

    def get_range(self, path: str, start: int, end: int) -> bytes:
        self._first("get_range")
        return self.inner.get_range(path, start, end)

    def get_ranges(self, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:  # type: ignore[override]
        self._first("get_ranges")
        return self.inner.get_ranges(path, ranges)

    def get_suffix(self, path: str, length: int) -> bytes:
        self._first("get_suffix")
        return self.inner.get_suffix(path, length)

    def head(self, path: str) -> ObjectMeta:
        self._first("head")
        return self.inner.head(path)

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        self._first(f"put {mode}")
        return self.inner.put(path, data, mode=mode)

    def delete(self, path: str) -> None:
        self._first("delete")
        self.inner.delete(path)

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        self._first("list")
        return self.inner.list(prefix, offset=offset)

    def copy(self, source: str, destination: str) -> None:
        self._first("copy")
        self.inner.copy(source, destination)


REQUESTS: dict[str, Callable[[ObjectStore], object]] = {
    "get": lambda s: s.get("k"),
    "get_range": lambda s: s.get_range("k", 1, 3),
    "get_ranges": lambda s: s.get_ranges("k", [(0, 1), (2, 3)]),
    "get_suffix": lambda s: s.get_suffix("k", 2),
    "head": lambda s: s.head("k").size,
    "put overwrite": lambda s: s.put("k", b"data") and None,  # each put has a new ETag
    "delete": lambda s: s.delete("gone"),
    "list": lambda s: [m.path for m in s.list("")],
    "copy": lambda s: s.copy("k", "k2"),
}


@pytest.mark.parametrize("op", sorted(REQUESTS))
def test_every_idempotent_request_is_tried_again_after_store_unavailable(op: str) -> None:
    inner = open_store("memory://")
    inner.put("k", b"data")
    flaky = FailEachOnce(inner)
    expected = REQUESTS[op](inner)
    assert REQUESTS[op](RetryingStore(flaky, 3)) == expected
    assert flaky.calls == {op: 2}


def test_a_create_is_not_retried_and_a_spent_budget_stops_retries() -> None:
    flaky = FailEachOnce(open_store("memory://"))
    with pytest.raises(StoreUnavailable):
        RetryingStore(flaky, 3).put("k", b"x", mode="create")
    assert flaky.calls == {"put create": 1}
    # The budget counts from the first try (timed before it): none is left after it.
    flaky = FailEachOnce(open_store("memory://"))
    with pytest.raises(StoreUnavailable, match=r"connection reset \(get_range\)"):
        RetryingStore(flaky, 3, give_up_after=0.0).get_range("k", 0, 1)
    assert flaky.calls == {"get_range": 1}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_single_range_reads_keep_descriptors_bounded_and_answer_as_a_range_get(
    tmp_path: Path,
) -> None:
    (tmp_path / "compacted").mkdir()
    for i in range(6):
        (tmp_path / "compacted" / f"{i}.sst").write_bytes(b"%d" % i * 100)
    reads = LocalReads(str(tmp_path), "file://x", max_open=2)
    baseline = open_fds()
    for _ in range(2):
        for i in range(6):
            assert reads.get_range(f"compacted/{i}.sst", 98, 200) == b"%d" % i * 2
    assert open_fds() == baseline + 2
    assert reads.get_range("compacted/5.sst", 0, 1) == b"5"  # kept: read without an open
    with pytest.raises(StoreUnavailable, match="starts outside"):
        reads.get_range("compacted/5.sst", 100, 101)
    with pytest.raises(NotFound):
        reads.get_range("compacted/9.sst", 0, 1)
    with pytest.raises(InvalidArgument):
        reads.get_range("compacted/../x", 0, 1)
    # The most recently used stay: 5 was read last, then 4 is opened, evicting the older.
    assert reads.get_range("compacted/4.sst", 0, 1) == b"4"
    assert list(reads._handles) == ["compacted/5.sst", "compacted/4.sst"]
    reads.close()
    assert open_fds() == baseline


def test_a_descriptor_evicted_under_single_range_reads_is_closed_after_them(
    tmp_path: Path,
) -> None:
    (tmp_path / "compacted").mkdir()
    for i in range(3):
        (tmp_path / "compacted" / f"{i}.sst").write_bytes(bytes([i]) * (1 << 18))
    reads = LocalReads(str(tmp_path), "file://x", max_open=1)
    baseline = open_fds()
    errors: list[BaseException] = []

    def reader(i: int) -> None:
        try:
            for n in range(500):
                start = (n * 4096) % (1 << 18)
                data = reads.get_range(f"compacted/{i}.sst", start, start + (1 << 17))
                assert data == bytes([i]) * min(1 << 17, (1 << 18) - start)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert open_fds() == baseline + 1
    reads.close()
    assert open_fds() == baseline


def test_a_read_that_fails_in_the_kernel_is_a_typed_error(tmp_path: Path) -> None:
    # A directory opens read-only on Linux, and then pread fails (EISDIR): a GET of it
    # answers NotFound, never a bare OSError.
    (tmp_path / "compacted" / "dir.sst").mkdir(parents=True)
    (tmp_path / "plain").mkdir()
    reads = LocalReads(str(tmp_path), "file://x")
    for path in ("compacted/dir.sst", "plain"):
        with pytest.raises(NotFound, match="a directory"):
            reads.get(path)
        with pytest.raises(NotFound, match="a directory"):
            reads.get_ranges(path, [(0, 10)])
