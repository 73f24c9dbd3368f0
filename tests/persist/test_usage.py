"""Usage errors commit nothing (RFC 0015 §9, §13.4): each raises its type at once, and the
consensus head, the store's objects and its write requests are unchanged
(``handles_kit.nothing_committed``).

Every part here is a blob (``inline_part_max_bytes=0``), so a call that wrote its parts
before checking its arguments would show. The cases already covered elsewhere
(``test_write``, ``test_read``, ``test_client``, ``test_critical``) assert the same there;
this module holds the entry points and orders they did not reach: ``append``, ``batch`` and
the builder's inputs, values that are not bytes, bounds checked before an upper that moved,
batches of another shard handed over as objects, and calls of handles whose lease lapsed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from slatepy.persist import (
    InvalidBounds,
    PersistClient,
    PersistSettings,
    UsageError,
    WriteHandle,
)
from tests.persist.compaction_kit import part_paths
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    Clock,
    nothing_committed,
    state_of,
    url_fixture,
    validate_states,
)

HOLLOW = PersistSettings(
    inline_part_max_bytes=0,
    reader_lease=10.0,
    writer_lease=100.0,
    batch_lease=10.0,
    consensus_min_age=1.0,
    allow_short_leases=True,
)


@pytest.fixture(name="clock")
def clock_fixture() -> Clock:
    return Clock()


@pytest.fixture(name="client")
def hollow_client(url: str, clock: Clock) -> Iterator[PersistClient]:
    with PersistClient.open(url, settings=HOLLOW, clock=clock) as opened:
        yield opened


def upd(key: object, time: object, diff: object = 1, value: object = b"v") -> object:
    return (key, value), time, diff


@pytest.fixture(name="write")
def moved_writer(client: PersistClient) -> WriteHandle:
    """A writer whose shard's upper is 4 (with data), so that an order mistake would show as
    an ``UpperMismatch`` instead of the usage error."""
    write = client.open_writer(SHARD)
    write.compare_and_append([((b"a", b"v"), 1, 1)], 0, 4)
    return write


Call = Callable[[WriteHandle], object]

BOUNDS: dict[str, Call] = {
    "append: lower beyond upper": lambda w: w.append([], 6, 5),
    "append: lower equal to upper": lambda w: w.append([], 2, 2),
    "append: None lower": lambda w: w.append([], None, 5),  # type: ignore[arg-type]
    "batch: lower beyond upper": lambda w: w.batch([upd(b"k", 5)], 6, 5),  # type: ignore[list-item]
    "caa: new below expected, stale expected": lambda w: w.compare_and_append([], 1, 0),
    "caa_batch: new equal to expected": lambda w: w.compare_and_append_batch([], 1, 1),
    "builder: finish below lower": lambda w: w.builder(5).finish(4),
}


@pytest.mark.parametrize("call", list(BOUNDS.values()), ids=list(BOUNDS))
def test_invalid_bounds_are_raised_before_the_upper_is_compared(
    client: PersistClient, write: WriteHandle, call: Call
) -> None:
    with nothing_committed(client), pytest.raises(InvalidBounds):
        call(write)


UPDATES: dict[str, Call] = {
    "append: time at upper": lambda w: w.append([upd(b"k", 6)], 4, 6),  # type: ignore[list-item]
    "append: time below lower": lambda w: w.append([upd(b"k", 3)], 4, 6),  # type: ignore[list-item]
    "append: key not bytes": lambda w: w.append([upd("k", 4)], 4, 6),  # type: ignore[list-item]
    "append: value not bytes": lambda w: w.append([upd(b"k", 4, value=7)], 4, 6),  # type: ignore[list-item]
    "caa: value not bytes": lambda w: w.compare_and_append([upd(b"k", 4, value="v")], 4, 6),  # type: ignore[list-item]
    "caa: key a bytearray": lambda w: w.compare_and_append([upd(bytearray(b"k"), 4)], 4, 6),  # type: ignore[list-item]
    "caa: good updates, then a bad one": lambda w: w.compare_and_append(
        [upd(b"a", 4), upd(b"b", 5), upd(b"c", 9)],  # type: ignore[list-item]
        4,
        6,
    ),
    "batch: time outside": lambda w: w.batch([upd(b"k", 9)], 4, 6),  # type: ignore[list-item]
    "batch: value not bytes": lambda w: w.batch([upd(b"k", 4, value=None)], 4, 6),  # type: ignore[list-item]
    "builder: key not bytes": lambda w: w.builder(4).add("k", b"v", 4, 1),  # type: ignore[arg-type]
    "builder: value not bytes": lambda w: w.builder(4).add(b"k", 1, 4, 1),  # type: ignore[arg-type]
    "builder: time not before upper": lambda w: _built(w, 5, 5),
}


def _built(write: WriteHandle, time: int, upper: int) -> object:
    builder = write.builder(4)
    builder.add(b"k", b"v", time, 1)
    return builder.finish(upper)


@pytest.mark.parametrize("call", list(UPDATES.values()), ids=list(UPDATES))
def test_malformed_updates_are_usage_errors_that_write_no_part(
    client: PersistClient, write: WriteHandle, call: Call
) -> None:
    with nothing_committed(client), pytest.raises(UsageError) as info:
        call(write)
    assert not isinstance(info.value, InvalidBounds)


def test_a_batch_object_of_another_shard_is_refused(
    client: PersistClient, write: WriteHandle
) -> None:
    foreign = client.open_writer("other").batch([upd(b"k", 0)], 0, 1)  # type: ignore[list-item]
    with nothing_committed(client), pytest.raises(UsageError, match="cannot be applied"):
        write.compare_and_append_batch([foreign], 4, 5)
    with nothing_committed(client, "other"), pytest.raises(UsageError):
        write.compare_and_append_batch([foreign], 0, 1)


def test_a_batch_that_does_not_cover_the_range_is_refused_before_the_upper(
    client: PersistClient, write: WriteHandle
) -> None:
    batch = write.batch([upd(b"k", 5)], 5, 7)  # type: ignore[list-item]
    with nothing_committed(client), pytest.raises(UsageError, match="cover"):
        write.compare_and_append_batch([batch], 4, 6)  # the upper is 4: it would fit


def test_calls_of_a_writer_whose_lease_lapsed_commit_nothing(
    client: PersistClient, write: WriteHandle, clock: Clock
) -> None:
    clock.advance(HOLLOW.writer_lease + 1)
    batch = write.batch([upd(b"k", 4)], 4, 5)  # type: ignore[list-item]
    calls: list[Callable[[], object]] = [
        lambda: write.compare_and_append([upd(b"k", 4)], 4, 5),  # type: ignore[list-item]
        lambda: write.append([upd(b"k", 4)], 4, 5),  # type: ignore[list-item]
        lambda: write.compare_and_append_batch([batch], 4, 5),
    ]
    for call in calls:
        seqno, parts = state_of(client).seqno, part_paths(client)
        with pytest.raises(UsageError, match="lease expired"):
            call()
        # Only the state can tell a lapsed lease: the parts written first are deleted again.
        assert state_of(client).seqno == seqno  # the lapsed writer is not even dropped
        assert part_paths(client) == parts
    assert state_of(client).upper == 4


def test_calls_of_a_reader_whose_lease_lapsed_commit_nothing(
    client: PersistClient, write: WriteHandle, clock: Clock
) -> None:
    read = client.open_leased_reader(SHARD)
    listen = read.listen(0)
    clock.advance(HOLLOW.reader_lease + 1)
    write.compare_and_append([], 4, 5)  # drops the lapsed reader (and writer: it re-registers)
    with nothing_committed(client):
        with pytest.raises(UsageError, match="not registered"):
            read.snapshot(1)
        with pytest.raises(UsageError, match="not registered"):
            listen.fetch_next(timeout=1.0)
        listen.close()  # its hold would keep the since where it is: nothing to send
        with pytest.raises(UsageError, match="not registered"):
            read.downgrade_since(3)


def test_finalizing_a_shard_whose_upper_is_open_commits_nothing(client: PersistClient) -> None:
    read = client.open_leased_reader(SHARD)
    read.downgrade_since(None)  # since None, upper still 0
    with nothing_committed(client), pytest.raises(UsageError, match="since and upper"):
        client.finalize_shard(SHARD)
    assert not state_of(client).finalized
