"""The ``ObjectStore`` conformance suite: what every backend must do, as pytest tests.

Everything above ``slatepy.store`` relies on these behaviours and nothing else, so a backend
(or a wrapper) that passes them can carry a database. Use it like zarr's ``StoreTests``:
subclass :class:`StoreConformance` in a test module and provide a ``store`` fixture that
returns a fresh, empty store; optionally override ``unreachable_store`` (a store whose
endpoint refuses connections) and ``missing_bucket_store`` (one whose bucket or container does
not exist) for the error-mapping tests, which skip while those return ``None``::

    class TestMyBackend(StoreConformance):
        @pytest.fixture
        def store(self) -> ObjectStore:
            return open_store("memory://")

Reads of a missing object raise ``NotFound``; conditional writes raise ``AlreadyExists`` and
``PreconditionFailed``; a store that cannot be reached raises ``StoreUnavailable`` whose
``definite`` is True for reads and False for writes (a write may have landed before the
connection broke). No backend exception other than these ever escapes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

import pytest

from slatepy.errors import AlreadyExists, NotFound, PreconditionFailed, StoreUnavailable
from slatepy.store.base import IfMatch, ObjectStore
from slatepy.store.obstore_store import STREAM_PART_BYTES

PAYLOAD = b"0123456789"


class StoreConformance:
    """Mix-in of conformance tests; subclasses provide the ``store`` fixture."""

    @pytest.fixture
    def unreachable_store(self) -> ObjectStore | None:
        """A store whose endpoint refuses connections; ``None`` skips those tests."""
        return None

    @pytest.fixture
    def missing_bucket_store(self) -> ObjectStore | None:
        """A store whose bucket or container does not exist; ``None`` skips that test."""
        return None

    # Whole objects.

    def test_put_then_get_returns_the_bytes(self, store: ObjectStore) -> None:
        etag = store.put("obj", PAYLOAD)
        assert etag is None or (isinstance(etag, str) and etag)
        assert store.get("obj") == PAYLOAD

    def test_overwrite_replaces_the_object(self, store: ObjectStore) -> None:
        store.put("obj", b"first")
        store.put("obj", b"second, longer")
        assert store.get("obj") == b"second, longer"
        assert store.head("obj").size == len(b"second, longer")

    def test_empty_objects_round_trip(self, store: ObjectStore) -> None:
        store.put("empty", b"")
        assert store.get("empty") == b""
        assert store.head("empty").size == 0

    def test_head_describes_the_object(self, store: ObjectStore) -> None:
        etag = store.put("dir/obj", PAYLOAD)
        meta = store.head("dir/obj")
        assert meta.path == "dir/obj"
        assert meta.size == len(PAYLOAD)
        assert isinstance(meta.last_modified, datetime)
        assert meta.last_modified.tzinfo is not None
        if etag is not None:
            assert meta.e_tag == etag

    # Ranges.

    def test_get_range_returns_the_slice(self, store: ObjectStore) -> None:
        store.put("obj", PAYLOAD)
        assert store.get_range("obj", 2, 5) == b"234"
        assert store.get_range("obj", 0, 10) == PAYLOAD
        assert store.get_range("obj", 9, 10) == b"9"

    def test_get_range_is_shorter_when_the_object_ends_first(self, store: ObjectStore) -> None:
        store.put("obj", PAYLOAD)
        assert store.get_range("obj", 7, 100) == b"789"

    def test_get_range_of_nothing_is_empty(self, store: ObjectStore) -> None:
        store.put("obj", PAYLOAD)
        assert store.get_range("obj", 4, 4) == b""
        assert store.get_range("obj", 5, 3) == b""

    def test_get_ranges_returns_each_range_in_order(self, store: ObjectStore) -> None:
        store.put("obj", PAYLOAD)
        ranges = [(8, 10), (0, 2), (1, 4), (5, 5)]
        assert store.get_ranges("obj", ranges) == [b"89", b"01", b"123", b""]
        assert store.get_ranges("obj", []) == []

    def test_get_ranges_of_a_large_object(self, store: ObjectStore) -> None:
        data = bytes(range(256)) * 1024  # 256 KiB: ranges far apart, as SST blocks are
        store.put("big", data)
        ranges = [(0, 4096), (100_000, 104_096), (len(data) - 10, len(data))]
        assert store.get_ranges("big", ranges) == [data[s:e] for s, e in ranges]

    # Suffixes: one request where ``supports_suffix``, HEAD + range GET elsewhere.

    def test_get_suffix_returns_the_tail(self, store: ObjectStore) -> None:
        store.put("obj", PAYLOAD)
        assert isinstance(store.supports_suffix, bool)
        assert store.get_suffix("obj", 3) == b"789"
        assert store.get_suffix("obj", 10) == PAYLOAD
        assert store.get_suffix("obj", 100) == PAYLOAD

    def test_get_suffix_of_a_large_object(self, store: ObjectStore) -> None:
        data = bytes(range(256)) * 1024
        store.put("big", data)
        assert store.get_suffix("big", 64 * 1024) == data[-64 * 1024 :]

    def test_get_suffix_reads_the_current_object(self, store: ObjectStore) -> None:
        store.put("obj", b"old contents, long")
        store.put("obj", b"new")
        assert store.get_suffix("obj", 8) == b"new"

    # Listing.

    def test_list_is_sorted_recursive_and_bounded_by_the_prefix(self, store: ObjectStore) -> None:
        for name in ["d/3", "d/1", "d/sub/2", "dx/1", "e/1"]:
            store.put(name, name.encode())
        assert [m.path for m in store.list("d/")] == ["d/1", "d/3", "d/sub/2"]
        assert [m.path for m in store.list("d/sub/")] == ["d/sub/2"]
        assert store.list("nothing/") == []
        listed = {m.path: m for m in store.list("")}
        assert sorted(listed) == ["d/1", "d/3", "d/sub/2", "dx/1", "e/1"]
        assert listed["d/sub/2"].size == len(b"d/sub/2")

    def test_list_offset_returns_paths_after_it(self, store: ObjectStore) -> None:
        for i in range(1, 6):
            store.put(f"w/{i:03}", b"x")
        assert [m.path for m in store.list("w/", offset="w/002")] == ["w/003", "w/004", "w/005"]
        assert [m.path for m in store.list("w/", offset="w/0025")] == ["w/003", "w/004", "w/005"]
        assert store.list("w/", offset="w/005") == []
        assert len(store.list("w/", offset="a")) == 5

    def test_list_many_objects(self, store: ObjectStore) -> None:
        names = [f"many/{i:05}" for i in range(120)]
        for name in names:
            store.put(name, b"")
        assert [m.path for m in store.list("many/")] == names

    # Delete and copy.

    def test_delete_removes_and_is_idempotent(self, store: ObjectStore) -> None:
        store.put("gone", PAYLOAD)
        store.delete("gone")
        with pytest.raises(NotFound):
            store.get("gone")
        assert store.list("") == []
        store.delete("gone")
        store.delete("never-existed")

    def test_copy_writes_the_destination(self, store: ObjectStore) -> None:
        store.put("src", PAYLOAD)
        store.put("dst", b"to be replaced")
        store.copy("src", "dst")
        assert store.get("dst") == PAYLOAD
        assert store.get("src") == PAYLOAD

    # Streamed writes.

    def test_streamed_write_is_visible_only_after_commit(self, store: ObjectStore) -> None:
        # Three parts of a multipart upload, sent from pieces that do not align with them.
        pieces = [bytes([i]) * (STREAM_PART_BYTES - 1000 * i) for i in range(1, 4)]
        writer = store.open_writer("big/obj")
        for piece in pieces:
            writer.write(piece)
        with pytest.raises(NotFound):
            store.get("big/obj")
        assert store.list("big/") == []
        writer.commit()
        assert store.get("big/obj") == b"".join(pieces)
        assert [m.path for m in store.list("big/")] == ["big/obj"]

    def test_small_streamed_write_round_trips(self, store: ObjectStore) -> None:
        writer = store.open_writer("small")
        writer.write(PAYLOAD)
        writer.write(bytearray(b"!"))
        writer.commit()
        assert store.get("small") == PAYLOAD + b"!"

    def test_aborted_streamed_write_leaves_nothing(self, store: ObjectStore) -> None:
        writer = store.open_writer("dropped")
        writer.write(b"x" * (STREAM_PART_BYTES + 1))  # a part is on its way
        writer.abort()
        writer.abort()
        with pytest.raises(NotFound):
            store.get("dropped")
        assert store.list("") == []

    # Conditional writes.

    def test_create_refuses_an_existing_object(self, store: ObjectStore) -> None:
        store.put("slot", b"first", mode="create")
        with pytest.raises(AlreadyExists) as raised:
            store.put("slot", b"second", mode="create")
        assert raised.value.path == "slot"
        assert store.get("slot") == b"first"

    def test_create_after_delete_succeeds(self, store: ObjectStore) -> None:
        store.put("slot", b"first", mode="create")
        store.delete("slot")
        store.put("slot", b"again", mode="create")
        assert store.get("slot") == b"again"

    def test_racing_creates_have_exactly_one_winner(self, store: ObjectStore) -> None:
        contenders = 8
        barrier = threading.Barrier(contenders)
        outcomes: list[str] = []
        lock = threading.Lock()

        def contend(i: int) -> None:
            barrier.wait(timeout=30)
            try:
                store.put("race", b"writer-%d" % i, mode="create")
                outcome = f"won:{i}"
            except AlreadyExists:
                outcome = "lost"
            with lock:
                outcomes.append(outcome)

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        winners = [o for o in outcomes if o.startswith("won:")]
        assert len(outcomes) == contenders and len(winners) == 1, outcomes
        assert store.get("race") == b"writer-" + winners[0].split(":")[1].encode()

    def test_if_match_replaces_only_the_expected_version(self, store: ObjectStore) -> None:
        if not store.supports_if_match:
            pytest.skip("this backend has no atomic If-Match writes (supports_if_match)")
        etag = store.put("m", b"v1")
        assert etag
        etag2 = store.put("m", b"v2", mode=IfMatch(etag))
        with pytest.raises(PreconditionFailed) as raised:
            store.put("m", b"v3", mode=IfMatch(etag))
        assert raised.value.path == "m"
        assert store.get("m") == b"v2"
        assert etag2 and etag2 != etag

    def test_if_match_accepts_etags_from_head_and_list(self, store: ObjectStore) -> None:
        if not store.supports_if_match:
            pytest.skip("this backend has no atomic If-Match writes (supports_if_match)")
        store.put("m", b"v1")
        head_etag = store.head("m").e_tag
        assert head_etag
        store.put("m", b"v2", mode=IfMatch(head_etag))
        (listed,) = store.list("")
        assert listed.e_tag
        store.put("m", b"v3", mode=IfMatch(listed.e_tag))
        assert store.get("m") == b"v3"

    def test_if_match_on_a_missing_object_fails(self, store: ObjectStore) -> None:
        if not store.supports_if_match:
            pytest.skip("this backend has no atomic If-Match writes (supports_if_match)")
        etag = store.put("m", b"v1")
        assert etag
        with pytest.raises(PreconditionFailed):
            store.put("other", b"v", mode=IfMatch(etag))
        with pytest.raises(NotFound):
            store.get("other")

    # Error mapping.

    def test_missing_objects_raise_not_found(self, store: ObjectStore) -> None:
        reads: dict[str, Callable[[], object]] = {
            "get": lambda: store.get("missing"),
            "head": lambda: store.head("missing"),
            "get_range": lambda: store.get_range("missing", 0, 4),
            "get_ranges": lambda: store.get_ranges("missing", [(0, 4)]),
            "get_suffix": lambda: store.get_suffix("missing", 4),
            "copy": lambda: store.copy("missing", "elsewhere"),
        }
        for name, read in reads.items():
            with pytest.raises(NotFound) as raised:
                read()
            assert raised.value.path == "missing", name
            assert raised.value.definite, name

    def test_unreachable_store_raises_store_unavailable(
        self, unreachable_store: ObjectStore | None
    ) -> None:
        if unreachable_store is None:
            pytest.skip("this backend has no network endpoint to make unreachable")
        with pytest.raises(StoreUnavailable) as read:
            unreachable_store.get("obj")
        assert read.value.definite, "a failed read changed nothing"
        with pytest.raises(StoreUnavailable) as listing:
            unreachable_store.list("")
        assert listing.value.definite
        with pytest.raises(StoreUnavailable) as write:
            unreachable_store.put("obj", PAYLOAD, mode="create")
        assert not write.value.definite, "a failed write may have landed"

    def test_missing_bucket_is_not_found(self, missing_bucket_store: ObjectStore | None) -> None:
        if missing_bucket_store is None:
            pytest.skip("this backend has no buckets or containers")
        with pytest.raises(NotFound, match="bucket or container"):
            missing_bucket_store.list("")
        with pytest.raises(NotFound, match="bucket or container"):
            missing_bucket_store.put("obj", PAYLOAD)
        with pytest.raises(NotFound):
            missing_bucket_store.get("obj")


__all__ = ["PAYLOAD", "StoreConformance"]
