"""Write handles: ``compare_and_append``, ``append``'s four cases, the cached upper, expiry
(RFC 0015 §6.2, §6.3). One test per rule of the public contract, on memory and file."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy.errors import ClosedError, CorruptionError, StoreUnavailable, WriteStalled
from slatepy.persist import (
    InvalidBounds,
    PersistClient,
    PersistSettings,
    UpperMismatch,
    UsageError,
)
from slatepy.persist.state.records import HollowPart
from slatepy.store.url import open_store
from slatepy.testing.intercept import InterceptStore
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    TEST_SETTINGS,
    Clock,
    client_fixture,
    nothing_committed,
    state_of,
    url_fixture,
    validate_states,
)


def upd(key: bytes, time: int, diff: int = 1) -> tuple[tuple[bytes, bytes], int, int]:
    return (key, b"v"), time, diff


def snapshot(client: PersistClient, as_of: int) -> list[tuple[tuple[bytes, bytes], int, int]]:
    reader = client.open_leased_reader(SHARD)
    try:
        return reader.snapshot(as_of)
    finally:
        reader.expire()


def test_compare_and_append_moves_the_upper(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    assert write.upper == 0
    write.compare_and_append([((b"k", b"v"), 0, 1)], expected_upper=0, new_upper=1)
    assert write.upper == 1 and write.fetch_recent_upper() == 1
    assert snapshot(client, 0) == [((b"k", b"v"), 0, 1)]


def test_the_cached_upper_is_refreshed_by_fetch_recent_upper(client: PersistClient) -> None:
    write, other = client.open_writer(SHARD), client.open_writer(SHARD)
    other.compare_and_append([], 0, 5)
    assert write.upper == 0  # cached
    assert write.fetch_recent_upper() == 5
    assert write.upper == 5


def test_an_upper_mismatch_names_both_uppers_and_refreshes_the_cache(
    client: PersistClient,
) -> None:
    write, other = client.open_writer(SHARD), client.open_writer(SHARD)
    other.compare_and_append([upd(b"a", 0)], 0, 3)
    seqno = state_of(client).seqno
    with pytest.raises(UpperMismatch) as info:
        write.compare_and_append([upd(b"b", 0)], 0, 1)
    assert (info.value.expected, info.value.current) == (0, 3)
    assert write.upper == 3
    assert state_of(client).seqno == seqno  # nothing committed


def test_invalid_bounds_come_before_the_upper_compare(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    write.compare_and_append([], 0, 4)
    for expected, new in ((3, 1), (None, 5)):
        with nothing_committed(client), pytest.raises(InvalidBounds):
            write.compare_and_append([], expected, new)  # type: ignore[arg-type]
    # Updates over an empty interval stay a usage error (empty updates: a heartbeat).
    with nothing_committed(client), pytest.raises(InvalidBounds):
        write.compare_and_append([upd(b"a", 2)], 2, 2)
    assert state_of(client).upper == 4


@pytest.mark.parametrize(
    "bad",
    [
        [((b"k", b"v"), 5, 1)],  # time at new upper
        [(("k", b"v"), 0, 1)],  # key not bytes
        [((b"k", b"v"), 0, 2**63)],  # diff beyond i64
        [((b"k", b"v"), True, 1)],  # bool time
        [(b"k", 0, 1)],  # shape
    ],
)
def test_malformed_updates_are_usage_errors_and_commit_nothing(
    client: PersistClient, bad: list[object]
) -> None:
    write = client.open_writer(SHARD)
    with nothing_committed(client), pytest.raises(UsageError, match="update 0"):
        write.compare_and_append(bad, 0, 5)  # type: ignore[arg-type]


def test_zero_diffs_and_cancelling_updates_are_not_stored(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    write.compare_and_append([upd(b"a", 0, 0), upd(b"b", 1, 2), upd(b"b", 1, -2)], 0, 2)
    state = state_of(client)
    assert state.upper == 2 and all(batch.is_empty for batch in state.trace)


def test_closing_the_shard_then_appending_is_an_upper_mismatch_to_none(
    client: PersistClient,
) -> None:
    write = client.open_writer(SHARD)
    write.compare_and_append([upd(b"a", 7)], 0, None)
    assert write.upper is None
    with pytest.raises(UpperMismatch) as info:
        write.compare_and_append([], 0, 1)
    assert info.value.current is None


def test_append_at_the_upper_appends(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    write.append([upd(b"a", 0)], 0, 2)
    write.append([upd(b"b", 2)], 2, 4)
    assert write.upper == 4
    assert snapshot(client, 3) == [((b"a", b"v"), 3, 1), ((b"b", b"v"), 3, 1)]


def test_append_inside_the_range_appends_the_rest_and_drops_the_earlier_updates(
    client: PersistClient,
) -> None:
    replica, write = client.open_writer(SHARD), client.open_writer(SHARD)
    replica.append([upd(b"a", 0), upd(b"b", 1)], 0, 2)
    write.append([upd(b"a", 0), upd(b"b", 1), upd(b"c", 2)], 0, 3)
    assert write.upper == 3
    assert snapshot(client, 2) == [upd(b"a", 2), upd(b"b", 2), upd(b"c", 2)]


def test_append_at_or_beyond_its_upper_does_nothing(client: PersistClient) -> None:
    replica, write = client.open_writer(SHARD), client.open_writer(SHARD)
    replica.append([upd(b"a", 0)], 0, 5)
    seqno = state_of(client).seqno
    write.append([upd(b"a", 0)], 0, 5)
    write.append([upd(b"a", 1)], 1, 3)
    assert state_of(client).seqno == seqno
    assert snapshot(client, 4) == [upd(b"a", 4)]


def test_append_above_the_upper_is_an_upper_mismatch(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    with pytest.raises(UpperMismatch) as info:
        write.append([upd(b"a", 3)], 3, 5)
    assert (info.value.expected, info.value.current) == (3, 0)
    assert state_of(client).seqno == 0


def test_append_to_a_closed_shard_is_a_usage_error(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    write.append([], 0, None)
    with pytest.raises(UsageError, match="closed"):
        write.append([upd(b"a", 3)], 3, 5)


def test_append_checks_bounds_before_anything(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    with nothing_committed(client), pytest.raises(InvalidBounds):
        write.append([], 3, 3)


def test_large_batches_become_blob_parts_and_failed_ones_are_deleted(url: str) -> None:
    settings = PersistSettings(inline_part_max_bytes=0, allow_short_leases=True, batch_lease=10)
    with PersistClient.open(url, settings=settings) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"k%03d" % i, i % 3) for i in range(100)], 0, 3)
        parts = [p for b in state_of(client).trace for p in b.parts()]
        assert len(parts) == 1 and isinstance(parts[0], HollowPart)
        assert parts[0].updates == 100 and (parts[0].t_min, parts[0].t_max) == (0, 2)
        assert len(snapshot(client, 2)) == 100
        listed = client.blob.list(f"shards/{SHARD}/part/")
        with pytest.raises(UpperMismatch):
            write.compare_and_append([upd(b"z", 0)], 0, 1)
        assert client.blob.list(f"shards/{SHARD}/part/") == listed


def test_expire_removes_the_writer_and_the_handle_refuses_calls(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    write.compare_and_append([], 0, 1)
    assert write.writer_id in state_of(client).writers
    write.expire()
    write.expire()  # idempotent
    assert write.writer_id not in state_of(client).writers
    with pytest.raises(ClosedError):
        write.compare_and_append([], 1, 2)


def test_a_writer_whose_lease_expired_gets_a_usage_error(url: str) -> None:
    clock = Clock()
    settings = PersistSettings(
        writer_lease=10.0, batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True
    )
    with PersistClient.open(url, settings=settings, clock=clock) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([], 0, 1)
        clock.advance(60)
        with pytest.raises(UsageError, match="lease expired"):
            write.compare_and_append([], 1, 2)
        assert state_of(client).upper == 1


def test_parts_are_cut_at_the_target_size_and_put_in_the_background(url: str) -> None:
    settings = PersistSettings(
        inline_part_max_bytes=0,
        part_target_bytes=16 * 1024,
        batch_lease=10.0,
        consensus_min_age=1.0,
        allow_short_leases=True,
    )
    with PersistClient.open(url, settings=settings) as client:
        write = client.open_writer(SHARD)
        updates = [((b"k%05d" % i, b"x" * 100), i % 4, 1) for i in range(1000)]
        write.compare_and_append(updates, 0, 4)
        (batch,) = state_of(client).trace
        (run,) = batch.runs
        assert len(run) > 4 and sum(p.updates for p in run) == 1000
        keys = [p.key_lower for p in run if isinstance(p, HollowPart)]
        assert keys == sorted(keys)  # parts of a run in key order
        for part in run:
            assert isinstance(part, HollowPart)
            assert client.blob.head(f"shards/{SHARD}/{part.key}").size == part.size
        assert snapshot(client, 3) == sorted(((k, v), 3, 1) for (k, v), _, _ in updates)


@pytest.mark.parametrize("failing_put", [1, 3, 6])
def test_a_failed_part_put_commits_nothing_and_leaves_no_part(
    tmp_path: Path, failing_put: int
) -> None:
    """A put failing on a background thread (or the caller's, for the last part) fails the
    append; the parts put before it and those in flight are deleted, nothing is applied."""
    store = open_store(f"file://{tmp_path}", create=True)
    puts: list[str] = []

    def before_put(path: str) -> None:  # refuses every attempt at the chosen part
        if "/part/" in path:
            if path not in puts:
                puts.append(path)
            if puts.index(path) == failing_put - 1:
                raise StoreUnavailable(f"injected: PUT {path} refused", definite=True)

    settings = PersistSettings(inline_part_max_bytes=0, part_target_bytes=16 * 1024)
    with PersistClient.open(InterceptStore(store, before_put=before_put), settings=settings) as c:
        write = c.open_writer(SHARD)
        write.compare_and_append([], 0, 1)
        updates = [((b"k%05d" % i, b"x" * 100), 1, 1) for i in range(1000)]
        with pytest.raises(StoreUnavailable, match="injected"):
            write.compare_and_append(updates, 1, 2)
        assert len(puts) >= failing_put and state_of(c).upper == 1
        assert c.blob.list(f"shards/{SHARD}/part/") == []
        write.compare_and_append(updates, 1, 2)  # the next attempt writes them all
        assert snapshot(c, 1) == sorted(((k, v), 1, 1) for (k, v), _, _ in updates)


# -- batches, builders, shipping ---------------------------------------------------------


def test_a_batch_is_written_but_not_applied_until_compare_and_append_batch(
    client: PersistClient,
) -> None:
    write = client.open_writer(SHARD)
    batch = write.batch([upd(b"a", 0), upd(b"b", 1)], 0, 2)
    assert (batch.shard_id, batch.lower, batch.upper) == (SHARD, 0, 2)
    assert state_of(client).seqno == 0
    write.compare_and_append_batch([batch], 0, 2)
    assert write.upper == 2
    assert snapshot(client, 1) == [upd(b"a", 1), upd(b"b", 1)]


def test_a_batch_applies_to_any_range_it_covers_dropping_updates_outside(
    client: PersistClient,
) -> None:
    write = client.open_writer(SHARD)
    write.compare_and_append([], 0, 2)
    batch = write.batch([upd(b"a", 0), upd(b"b", 2), upd(b"c", 4)], 0, 6)
    write.compare_and_append_batch([batch], 2, 4)  # only b
    write.compare_and_append_batch([batch], 4, 6)  # again, for a disjoint range: only c
    assert snapshot(client, 5) == [upd(b"b", 5), upd(b"c", 5)]


def test_a_batch_that_does_not_cover_the_range_is_a_usage_error(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    batch = write.batch([upd(b"a", 1)], 1, 3)
    with nothing_committed(client):
        for expected, new in ((0, 2), (1, 4), (1, None)):
            with pytest.raises(UsageError, match="cover"):
                write.compare_and_append_batch([batch], expected, new)
        with pytest.raises(InvalidBounds):
            write.compare_and_append_batch([batch], 2, 2)
        with pytest.raises(UsageError, match="twice"):
            write.compare_and_append_batch([batch, batch], 1, 3)


def test_a_batch_stays_usable_after_an_upper_mismatch(client: PersistClient) -> None:
    write, other = client.open_writer(SHARD), client.open_writer(SHARD)
    batch = write.batch([upd(b"a", 0), upd(b"b", 1), upd(b"c", 2)], 0, 3)
    other.compare_and_append([upd(b"z", 0)], 0, 1)
    with pytest.raises(UpperMismatch) as info:
        write.compare_and_append_batch([batch], 0, 3)
    assert info.value.current == 1
    write.compare_and_append_batch([batch], 1, 3)
    assert snapshot(client, 2) == [upd(b"b", 2), upd(b"c", 2), upd(b"z", 2)]


def test_a_batch_ships_between_clients(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    settings = PersistSettings(
        inline_part_max_bytes=0, batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True
    )
    with (
        PersistClient.open(url, settings=settings) as a,
        PersistClient.open(url, settings=settings) as b,
    ):
        data = a.open_writer(SHARD).batch([upd(b"a", 0), upd(b"b", 1)], 0, 2).to_bytes()
        write = b.open_writer(SHARD)
        shipped = write.batch_from_bytes(data)
        write.compare_and_append_batch([shipped], 0, 2)
        assert snapshot(a, 1) == [upd(b"a", 1), upd(b"b", 1)]


def test_shipped_bytes_are_checked(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    data = bytearray(write.batch([upd(b"a", 0)], 0, 1).to_bytes())
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x01
        with pytest.raises((CorruptionError, UsageError)):
            write.batch_from_bytes(bytes(damaged))
    other = client.open_writer("other")
    with nothing_committed(client, "other"), pytest.raises(UsageError, match="cannot be applied"):
        other.batch_from_bytes(bytes(data))


def test_a_batch_older_than_half_the_batch_lease_is_refused(url: str) -> None:
    clock = Clock()
    with PersistClient.open(url, settings=TEST_SETTINGS, clock=clock) as client:
        write = client.open_writer(SHARD)
        batch = write.batch([upd(b"a", 0)], 0, 1)
        clock.advance(TEST_SETTINGS.batch_lease / 2 + 1)
        with nothing_committed(client), pytest.raises(UsageError, match="too old"):
            write.compare_and_append_batch([batch], 0, 1)


def test_delete_removes_a_batch_that_was_never_applied(url: str) -> None:
    settings = PersistSettings(
        inline_part_max_bytes=0, batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True
    )
    with PersistClient.open(url, settings=settings) as client:
        batch = client.open_writer(SHARD).batch([upd(b"a", 0)], 0, 1)
        assert client.blob.list(f"shards/{SHARD}/part/")
        batch.delete()
        assert client.blob.list(f"shards/{SHARD}/part/") == []


def test_a_builder_writes_full_buffers_as_runs(url: str) -> None:
    settings = PersistSettings(
        builder_buffer_bytes=2048, batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True
    )
    with PersistClient.open(url, settings=settings) as client:
        write = client.open_writer(SHARD)
        builder = write.builder(3)
        for i in range(200):
            builder.add(b"k%03d" % (i % 50), b"v", 3 + i % 4, 1)
        batch = builder.finish(7)
        assert len(batch.record.runs) > 2  # several buffers, several runs
        with pytest.raises(UsageError, match="finished"):
            builder.add(b"k", b"v", 3, 1)
        write.compare_and_append([], 0, 3)
        write.compare_and_append_batch([batch], 3, 7)
        contents = snapshot(client, 6)
        assert contents == [((b"k%03d" % k, b"v"), 6, 4) for k in range(50)]


def test_a_builder_checks_times_against_its_bounds(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    builder = write.builder(3)
    with pytest.raises(UsageError, match="outside"):
        builder.add(b"k", b"v", 2, 1)
    builder.add(b"k", b"v", 5, 1)
    with pytest.raises(UsageError, match="not before"):
        builder.finish(5)
    with pytest.raises(InvalidBounds):
        write.builder(3).finish(3)


def test_a_full_trace_stalls_data_appends_until_the_timeout(url: str) -> None:
    settings = PersistSettings(
        max_trace_batches=8,
        write_stall_timeout=0.1,
        batch_lease=10.0,
        consensus_min_age=1.0,
        allow_short_leases=True,
        compaction="off",
    )
    with PersistClient.open(url, settings=settings) as client:
        write = client.open_writer(SHARD)
        for t in range(8):  # nobody compacts: each data batch stays
            write.compare_and_append([upd(b"k", t)], t, t + 1)
        assert len(state_of(client).trace) == 8
        with pytest.raises(WriteStalled):
            write.compare_and_append([upd(b"k", 8)], 8, 9)
        write.compare_and_append([], 8, 9)  # progress-only appends go on
        assert write.upper == 9


@pytest.mark.parametrize("bounds", [("0", 1), (0, "1"), (-1, 1), (0, 2**64), (True, 2)])
def test_bounds_that_are_not_u64_times_are_usage_errors(
    client: PersistClient, bounds: tuple[object, object]
) -> None:
    write = client.open_writer(SHARD)
    with nothing_committed(client):
        with pytest.raises(UsageError):
            write.compare_and_append([], *bounds)  # type: ignore[arg-type]
        with pytest.raises(UsageError):
            write.append([], *bounds)  # type: ignore[arg-type]
        with pytest.raises(UsageError):
            write.batch([], *bounds)  # type: ignore[arg-type]


def test_a_blob_batch_keeps_its_parts_after_an_upper_mismatch(url: str) -> None:
    settings = PersistSettings(
        inline_part_max_bytes=0, batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True
    )
    with PersistClient.open(url, settings=settings) as client:
        write, other = client.open_writer(SHARD), client.open_writer(SHARD)
        batch = write.batch([upd(b"a", 1)], 0, 2)
        other.compare_and_append([], 0, 1)
        with pytest.raises(UpperMismatch):
            write.compare_and_append_batch([batch], 0, 2)
        write.compare_and_append_batch([batch], 1, 2)
        assert snapshot(client, 1) == [upd(b"a", 1)]
