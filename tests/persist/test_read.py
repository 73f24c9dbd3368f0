"""Leased readers: snapshots, listens, subscribes and the reader's since (RFC 0015 §7)."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from slatepy.errors import CorruptionError
from slatepy.persist import (
    PersistClient,
    PersistSettings,
    Progress,
    SinceError,
    Updates,
    UsageError,
)
from slatepy.persist.read import Event, ReadHandle
from slatepy.persist.state.records import HollowPart
from slatepy.store.metrics import MetricsStore
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    Clock,
    client_fixture,
    nothing_committed,
    state_of,
    url_fixture,
    validate_states,
)

Update = tuple[tuple[bytes, bytes], int, int]


def upd(key: bytes, time: int, diff: int = 1) -> Update:
    return (key, b"v"), time, diff


def test_snapshot_advances_times_to_as_of_and_consolidates(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    write.compare_and_append([upd(b"a", 0), upd(b"b", 1, 2)], 0, 2)
    write.compare_and_append([upd(b"a", 2, -1), upd(b"b", 3), upd(b"c", 4)], 2, 5)
    read = client.open_leased_reader(SHARD)
    assert read.snapshot(1) == [upd(b"a", 1), upd(b"b", 1, 2)]
    assert read.snapshot(3) == [upd(b"b", 3, 3)]  # a cancelled: no zero diff
    assert read.snapshot(4) == [upd(b"b", 4, 3), upd(b"c", 4)]
    assert list(read.snapshot_iter(3)) == read.snapshot(3)


def test_snapshot_waits_until_the_upper_passes_as_of(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    read = client.open_leased_reader(SHARD)
    timer = threading.Timer(0.1, lambda: write.compare_and_append([upd(b"a", 2)], 0, 3))
    timer.start()
    try:
        assert read.snapshot(2, timeout=10.0) == [upd(b"a", 2)]
    finally:
        timer.join()


def test_snapshot_times_out_when_the_upper_does_not_move(client: PersistClient) -> None:
    read = client.open_leased_reader(SHARD)
    with pytest.raises(TimeoutError):
        read.snapshot(0, timeout=0.05)


def test_reads_before_the_since_are_since_errors(client: PersistClient) -> None:
    client.open_writer(SHARD).compare_and_append([], 0, 10)
    read = client.open_leased_reader(SHARD)
    assert read.downgrade_since(5) == 5
    with nothing_committed(client):
        for call in (read.snapshot, read.listen, read.subscribe):
            with pytest.raises(SinceError) as info:
                call(4)
            assert info.value.since == 5
        with pytest.raises(SinceError):
            read.snapshot(None)  # type: ignore[arg-type]


def test_since_only_moves_forward(client: PersistClient) -> None:
    read = client.open_leased_reader(SHARD)
    assert read.since == 0
    assert read.downgrade_since(5) == 5
    seqno = state_of(client).seqno
    assert read.downgrade_since(3) == 5  # a no-op answering the current since
    assert state_of(client).seqno == seqno and read.since == 5
    assert read.downgrade_since(None) is None


def collect(listen_events: list[Event]) -> tuple[list[Update], list[int | None]]:
    updates = [u for e in listen_events if isinstance(e, Updates) for u in e.updates]
    uppers = [e.upper for e in listen_events if isinstance(e, Progress)]
    return updates, uppers


def test_a_listen_delivers_each_later_update_once_then_progress(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    write.compare_and_append([upd(b"a", 0), upd(b"b", 1)], 0, 2)
    listen = client.open_leased_reader(SHARD).listen(0)
    first = listen.fetch_next(timeout=1.0)
    assert first == [Updates([upd(b"b", 1)]), Progress(2)]
    assert listen.fetch_next(timeout=0.05) == []  # nothing new: [] on timeout
    write.compare_and_append([], 2, 3)
    assert listen.fetch_next(timeout=1.0) == [Progress(3)]
    write.compare_and_append([upd(b"c", 3), upd(b"d", 5)], 3, 6)
    write.compare_and_append([upd(b"e", 6)], 6, None)
    events: list[Event] = []
    for event in listen:
        events.append(event)
    updates, uppers = collect(events)
    assert sorted(updates) == [upd(b"c", 3), upd(b"d", 5), upd(b"e", 6)]
    assert uppers[-1] is None
    assert listen.fetch_next(timeout=0.01) == []  # ended


def test_listen_events_keep_their_order_invariants(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    listen = client.open_leased_reader(SHARD).listen(0)
    events: list[Event] = []
    upper = 0
    for i in range(6):
        new = upper + 1 + i % 3
        write.compare_and_append([upd(b"k%d" % i, t) for t in range(upper, new)], upper, new)
        upper = new
        events += listen.fetch_next(timeout=1.0)
    seen: set[Update] = set()
    last = 0
    for event in events:
        if isinstance(event, Progress):
            assert event.upper is not None and event.upper > last
            last = event.upper
        else:
            for update in event.updates:
                assert update[1] > 0 and update[1] >= last and update not in seen
                seen.add(update)
    assert last == upper and len(seen) == upper - 1  # every t > as_of = 0, once


def test_a_listen_wakes_on_a_local_commit(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    listen = client.open_leased_reader(SHARD).listen(0)
    timer = threading.Timer(0.1, lambda: write.compare_and_append([upd(b"a", 1)], 0, 2))
    start = time.monotonic()
    timer.start()
    try:
        events = listen.fetch_next(timeout=10.0)
    finally:
        timer.join()
    assert events == [Updates([upd(b"a", 1)]), Progress(2)]
    assert time.monotonic() - start < 5.0


def test_subscribe_starts_with_the_snapshot_as_one_updates(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    write.compare_and_append([upd(b"a", 0), upd(b"b", 1), upd(b"c", 2)], 0, 3)
    sub = client.open_leased_reader(SHARD).subscribe(1)
    assert sub.fetch_next() == [Updates([upd(b"a", 1), upd(b"b", 1)])]
    assert sub.fetch_next(timeout=1.0) == [Updates([upd(b"c", 2)]), Progress(3)]


def test_an_open_listen_holds_the_since_below_its_frontier(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    read = client.open_leased_reader(SHARD)
    listen = read.listen(2)
    write.compare_and_append([], 0, 10)
    assert read.downgrade_since(8) == 2  # held at frontier - 1 = 2
    listen.fetch_next(timeout=1.0)  # frontier 10: the hold moves to 9
    assert read.since == 8
    listen.close()
    assert read.downgrade_since(9) == 9
    assert state_of(client).since == 9


@pytest.mark.parametrize("kind", ["listen", "subscribe"])
def test_a_listen_past_its_as_of_with_nothing_new_reports_progress_at_once(
    client: PersistClient, kind: str
) -> None:
    """Issue 27 ("listen progress"): upper 5, nothing in (4, 5): ``Progress(5)`` at once,
    not at the next append."""
    write = client.open_writer(SHARD)
    write.compare_and_append([upd(b"a", 1)], 0, 5)
    read = client.open_leased_reader(SHARD)
    if kind == "listen":
        listen = read.listen(4)
    else:
        listen = read.subscribe(4)
        assert listen.fetch_next(timeout=1.0) == [Updates([upd(b"a", 4)])]
    start = time.monotonic()
    assert listen.fetch_next(timeout=2.0) == [Progress(5)]
    assert time.monotonic() - start < 1.0
    assert listen.fetch_next(timeout=0.05) == []  # and only once
    write.compare_and_append([upd(b"b", 6)], 5, 7)
    assert listen.fetch_next(timeout=1.0) == [Updates([upd(b"b", 6)]), Progress(7)]
    listen.close()


def test_a_listen_dropped_without_close_stops_holding_the_since(client: PersistClient) -> None:
    """Issue 27, defect 9: the handle holds its listens weakly; a dropped one's hold goes
    at the next push (here the reader's heartbeat), not at the handle's end."""
    write = client.open_writer(SHARD)
    read = client.open_leased_reader(SHARD)
    listen = read.listen(2)
    write.compare_and_append([], 0, 10)
    assert read.downgrade_since(8) == 2  # held at frontier - 1 = 2
    del listen
    gc.collect()
    read.heartbeat()
    assert read.since == 8
    assert state_of(client).since == 8


def test_a_listen_only_its_iterator_references_keeps_holding_the_since(
    client: PersistClient,
) -> None:
    """Review of the weakly held listens (issue 27): ``for event in read.listen(t)`` keeps
    no name for the listen; while its iterator lives, the since stays held."""
    write = client.open_writer(SHARD)
    read = client.open_leased_reader(SHARD)
    write.compare_and_append([upd(b"a", 3)], 0, 5)
    events = iter(read.listen(2))
    assert next(events) == Updates([upd(b"a", 3)])
    gc.collect()
    assert read.downgrade_since(8) == 4  # held at frontier - 1 = 4
    read.heartbeat()
    assert state_of(client).since == 4
    assert next(events) == Progress(5)
    del events
    gc.collect()
    read.heartbeat()
    assert state_of(client).since == 8


def test_expire_releases_the_since(client: PersistClient) -> None:
    a, b = client.open_leased_reader(SHARD), client.open_leased_reader(SHARD)
    a.downgrade_since(3)
    b.downgrade_since(7)
    assert state_of(client).since == 3
    a.expire()
    assert state_of(client).since == 7


def test_a_reader_whose_lease_expired_gets_a_usage_error(url: str) -> None:
    clock = Clock()
    settings = PersistSettings(
        reader_lease=10.0, batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True
    )
    with PersistClient.open(url, settings=settings, clock=clock) as client:
        read = client.open_leased_reader(SHARD)
        write = client.open_writer(SHARD)
        clock.advance(60)
        write.compare_and_append([], 0, 1)  # the next transition expires the reader
        with nothing_committed(client), pytest.raises(UsageError, match="lease expired"):
            read.snapshot(0)


def blob_settings() -> PersistSettings:
    return PersistSettings(
        inline_part_max_bytes=0, batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True
    )


def test_a_damaged_part_is_corruption_naming_it(url: str) -> None:
    with PersistClient.open(url, settings=blob_settings()) as client:
        client.open_writer(SHARD).compare_and_append([upd(b"a", 0)], 0, 1)
        (part,) = state_of(client).trace[0].parts()
        assert isinstance(part, HollowPart)
        path = f"shards/{SHARD}/{part.key}"
        data = bytearray(client.blob.get(path))
        data[len(data) // 2] ^= 0xFF
        client.blob.put(path, bytes(data))
        with pytest.raises(CorruptionError) as info:
            client.open_leased_reader(SHARD).snapshot(0)
        assert info.value.path == path


def test_a_part_missing_under_a_live_reader_is_corruption(url: str) -> None:
    with PersistClient.open(url, settings=blob_settings()) as client:
        client.open_writer(SHARD).compare_and_append([upd(b"a", 0)], 0, 1)
        (part,) = state_of(client).trace[0].parts()
        assert isinstance(part, HollowPart)
        client.blob.delete(f"shards/{SHARD}/{part.key}")
        with pytest.raises(CorruptionError, match="missing"):
            client.open_leased_reader(SHARD).snapshot(0)


def test_read_times_that_are_not_u64_are_usage_errors(client: PersistClient) -> None:
    read = client.open_leased_reader(SHARD)
    with nothing_committed(client):
        _refuse_bad_times(read)


def _refuse_bad_times(read: ReadHandle) -> None:
    for bad in ("1", -1, 1.5, True):
        for call in (read.snapshot, read.listen, read.subscribe):
            with pytest.raises(UsageError):
                call(bad)  # type: ignore[arg-type]
        with pytest.raises(UsageError):
            read.downgrade_since(bad)  # type: ignore[arg-type]


def test_large_parts_are_read_in_chunks_and_runs_merged_with_sums(url: str) -> None:
    settings = PersistSettings(
        inline_part_max_bytes=0,
        snapshot_memory_bytes=1 << 20,
        batch_lease=10.0,
        consensus_min_age=1.0,
        allow_short_leases=True,
    )
    with PersistClient.open(url, settings=settings) as client:
        write = client.open_writer(SHARD)
        big = [((b"k%06d" % i, b"x" * 200), 0, 1) for i in range(6000)]  # ~1.3 MB
        write.compare_and_append(big, 0, 1)
        write.compare_and_append([((b"k%06d" % i, b"x" * 200), 1, -1) for i in range(3000)], 1, 2)
        read = client.open_leased_reader(SHARD)
        assert isinstance(client.blob, MetricsStore)
        before = client.blob.metrics.requests("get_range")
        contents = list(read.snapshot_iter(1))
        assert client.blob.metrics.requests("get_range") - before >= 3  # chunked, not whole
        assert contents == [((b"k%06d" % i, b"x" * 200), 1, 1) for i in range(3000, 6000)]


def test_reads_release_every_seqno_they_hold(client: PersistClient) -> None:
    client.open_writer(SHARD).compare_and_append([upd(b"a", 0)], 0, 2)
    read = client.open_leased_reader(SHARD)
    listen = read.listen(0)
    read.snapshot(1)
    listen.fetch_next(timeout=1.0)
    stream = read.snapshot_iter(1)
    assert read._pins  # held while the stream is open
    stream.close()  # type: ignore[attr-defined]
    with pytest.raises(TimeoutError):
        read.snapshot(5, timeout=0.01)
    assert not read._pins


def test_a_listen_skips_blob_parts_it_delivered_already(url: str) -> None:
    settings = PersistSettings(
        inline_part_max_bytes=0, batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True
    )
    with PersistClient.open(url, settings=settings) as client:
        write = client.open_writer(SHARD)
        listen = client.open_leased_reader(SHARD).listen(0)
        write.compare_and_append([upd(b"a", 1)], 0, 2)
        assert listen.fetch_next(timeout=1.0) == [Updates([upd(b"a", 1)]), Progress(2)]
        write.compare_and_append([], 2, 3)  # a metadata merge extends the data batch
        assert [b.desc.upper for b in state_of(client).trace] == [3]
        assert isinstance(client.blob, MetricsStore)
        before = client.blob.metrics.requests("get_range") + client.blob.metrics.requests("get")
        assert listen.fetch_next(timeout=1.0) == [Progress(3)]
        after = client.blob.metrics.requests("get_range") + client.blob.metrics.requests("get")
        assert after == before
