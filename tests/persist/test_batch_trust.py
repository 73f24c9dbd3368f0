"""What an applied or shipped batch may claim (issue 27): a replay of the caller's own
landed append is answered as its own (defect 3), a shipped batch is checked claim by
claim before it can reach a state (defect 7), a batch is never applied twice for the same
written times (defect 8), and ``compare_and_append([], u, u)`` is the seed's writer
heartbeat."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

from slatepy.errors import CorruptionError
from slatepy.format.envelope import seal
from slatepy.persist import InvalidBounds, PersistClient, UpperMismatch, UsageError
from slatepy.persist.codec import encode_diff, encode_inline, encode_key
from slatepy.persist.parts import inline_part
from slatepy.persist.state.records import HollowPart, InlinePart, Window
from slatepy.persist.write import BATCH_FORMAT_VERSION, BATCH_MAGIC, BatchRecord
from tests.persist.compaction_kit import HOLLOW, manual, part_paths, referenced, snapshot, upd
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    TEST_SETTINGS,
    Clock,
    nothing_committed,
    state_of,
    url_fixture,
    validate_states,
)


@pytest.fixture(name="hollow")
def hollow_fixture(url: str) -> Iterator[PersistClient]:
    """A client whose parts are all blobs."""
    with manual(PersistClient.open(url, settings=HOLLOW)) as opened:
        yield opened


def _ship(record: BatchRecord) -> bytes:
    return seal(BATCH_MAGIC, BATCH_FORMAT_VERSION, msgspec.msgpack.encode(record))


# -- defect 3: the own-append rule --------------------------------------------------------


def test_a_replay_of_the_callers_own_landed_append_is_answered_as_its_own(
    hollow: PersistClient,
) -> None:
    shipped = hollow.open_writer(SHARD).batch([upd(b"a", 0)], 0, None).to_bytes()
    first = hollow.open_writer(SHARD)
    assert first.compare_and_append_batch(
        [first.batch_from_bytes(shipped)], 0, 1, idempotency=("sink", 1), forward=True
    )
    # The driver's reply was lost; the replay (new writer, re-minted uppers) carries the
    # same batch: True, its parts stay. False would have told it to delete them.
    replay = hollow.open_writer(SHARD)
    again = replay.batch_from_bytes(shipped)
    assert replay.compare_and_append_batch([again], 1, 2, idempotency=("sink", 1), forward=True)
    assert referenced(state_of(hollow)) <= part_paths(hollow)
    assert snapshot(hollow, 0) == [upd(b"a", 0)]
    with pytest.raises(UsageError, match="applied"):
        again.delete()  # it is referenced: GC alone may delete it
    # The same key with the landed batch and one more: neither True nor False is so.
    extra = replay.batch([upd(b"c", 0)], 0, None)
    with nothing_committed(hollow), pytest.raises(UsageError, match="shares parts"):
        replay.compare_and_append_batch(
            [replay.batch_from_bytes(shipped), extra], 1, 2, idempotency=("sink", 1), forward=True
        )
    extra.delete()
    # Another batch under a recorded key is someone else's append: False, not referenced.
    other = replay.batch([upd(b"b", 0)], 0, None)
    assert not replay.compare_and_append_batch([other], 1, 2, idempotency=("sink", 1), forward=True)
    other.delete()
    assert referenced(state_of(hollow)) <= part_paths(hollow)
    assert snapshot(hollow, 0) == [upd(b"a", 0)]


# -- defect 7: shipped batches are checked claim by claim ---------------------------------


def _forged(hollow: PersistClient) -> tuple[BatchRecord, BatchRecord]:
    """A good shipped hollow batch for [0, 10) and a good inline one."""
    write = hollow.open_writer(SHARD)
    hollow_record = write.batch([upd(b"a", 1), upd(b"b", 2)], 0, 10).record
    inline = InlinePart(encode_inline([upd(b"a", 1)]), 1)
    return hollow_record, msgspec.structs.replace(hollow_record, runs=((inline,),))


def _with_part(record: BatchRecord, **changes: object) -> BatchRecord:
    ((part,),) = record.runs
    return msgspec.structs.replace(record, runs=((msgspec.structs.replace(part, **changes),),))


def _raw(*updates: tuple[bytes, int, int]) -> bytes:
    """An inline part's bytes holding exactly ``updates`` (``(key, time, diff)``), unchecked."""
    entries = [(encode_key(k, b"v", t), t, encode_diff(d)) for k, t, d in updates]
    return inline_part(entries).data


BAD_CLAIMS = {
    "hollow forward": lambda h, i: _with_part(h, forward=5),
    "inline forward": lambda h, i: _with_part(i, forward=5),
    "inline time beyond upper": lambda h, i: _with_part(
        i, data=encode_inline([upd(b"a", 1), upd(b"z", 10)]), updates=2
    ),
    "inline count": lambda h, i: _with_part(i, updates=3),
    "inline unsorted": lambda h, i: _with_part(i, data=_raw((b"b", 1, 1), (b"a", 1, 1)), updates=2),
    "inline zero diff": lambda h, i: _with_part(i, data=_raw((b"a", 1, 0)), updates=1),
    "hollow t_max": lambda h, i: _with_part(h, t_max=10),
    "hollow t_min": lambda h, i: _with_part(h, t_min=3, t_max=2),
    "window outside": lambda h, i: _with_part(h, window=Window(5, 11)),
    "window empty": lambda h, i: _with_part(h, window=Window(5, 5)),
    "negative lower": lambda h, i: msgspec.structs.replace(h, lower=-1),
    "negative written_ms": lambda h, i: msgspec.structs.replace(h, written_ms=-5),
    "writer id": lambda h, i: msgspec.structs.replace(h, writer_id="../x"),
    "part named twice": lambda h, i: msgspec.structs.replace(h, runs=(h.runs[0], h.runs[0])),
}


@pytest.mark.parametrize("claim", BAD_CLAIMS)
def test_a_shipped_batch_claiming_what_is_not_so_is_refused_before_any_state(
    hollow: PersistClient, claim: str
) -> None:
    good_hollow, good_inline = _forged(hollow)
    bad = BAD_CLAIMS[claim](good_hollow, good_inline)
    receiver = hollow.open_writer(SHARD)
    with nothing_committed(hollow), pytest.raises(CorruptionError) as info:
        receiver.batch_from_bytes(_ship(bad))
    assert SHARD in str(info.value) and "persist batch" in str(info.value)
    # The good ones apply (the forgeries started from them).
    for good in (good_hollow, good_inline):
        receiver.batch_from_bytes(_ship(good))


def test_a_shipped_blob_part_is_read_only_within_the_bounds_its_batch_claims(
    hollow: PersistClient,
) -> None:
    write = hollow.open_writer(SHARD)
    wide = write.batch([upd(b"a", 1), upd(b"z", 15)], 0, 20).record
    ((part,),) = wide.runs
    assert isinstance(part, HollowPart)
    # Claims [0, 10) and times [1, 1]; the blob holds time 15 too.
    forged = msgspec.structs.replace(
        wide, upper=10, runs=((msgspec.structs.replace(part, t_max=1),),)
    )
    batch = write.batch_from_bytes(_ship(forged))
    write.compare_and_append_batch([batch], 0, 10)
    write.compare_and_append([], 10, 20)
    assert snapshot(hollow, 19) == [upd(b"a", 19)]  # not z: at 15, outside [0, 10)
    state_of(hollow).validate()


# -- defect 8: never twice for the same written times -------------------------------------


def test_a_batch_applied_forwarded_cannot_be_applied_again(hollow: PersistClient) -> None:
    write = hollow.open_writer(SHARD)
    batch = write.batch([upd(b"a", 0)], 0, None)
    assert write.compare_and_append_batch([batch], 0, 1, forward=True)
    with nothing_committed(hollow), pytest.raises(UsageError, match="twice"):
        write.compare_and_append_batch([batch], 1, 2, forward=True)
    # Its written times from 1 on were not applied: they may be, once.
    assert write.compare_and_append_batch([batch], 1, 2)
    with nothing_committed(hollow), pytest.raises(UsageError, match="twice"):
        write.compare_and_append_batch([batch], 2, 3, forward=True)
    assert snapshot(hollow, 1) == [upd(b"a", 1)]


def test_a_shipped_batch_applied_twice_by_two_receivers_is_refused_by_the_state(
    hollow: PersistClient,
) -> None:
    shipped = hollow.open_writer(SHARD).batch([upd(b"a", 0)], 0, None).to_bytes()
    one, two = hollow.open_writer(SHARD), hollow.open_writer(SHARD)
    assert one.compare_and_append_batch([one.batch_from_bytes(shipped)], 0, 1, forward=True)
    with nothing_committed(hollow), pytest.raises(UsageError, match="twice"):
        two.compare_and_append_batch([two.batch_from_bytes(shipped)], 1, 2, forward=True)
    assert snapshot(hollow, 0) == [upd(b"a", 0)]


def test_disjoint_ranges_of_one_batch_still_apply(hollow: PersistClient) -> None:
    write = hollow.open_writer(SHARD)
    batch = write.batch([upd(b"a", 0), upd(b"b", 1)], 0, 2)
    assert write.compare_and_append_batch([batch], 0, 1)
    assert write.compare_and_append_batch([batch], 1, 2)
    assert snapshot(hollow, 1) == [upd(b"a", 1), upd(b"b", 1)]


# -- departure: heartbeats ----------------------------------------------------------------


def test_compare_and_append_with_no_updates_at_the_upper_is_a_heartbeat(url: str) -> None:
    clock = Clock()
    with manual(PersistClient.open(url, settings=TEST_SETTINGS, clock=clock)) as client:
        write = client.open_writer(SHARD)
        stranger = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        before = state_of(client)
        clock.advance(5)
        write.compare_and_append([], 1, 1)
        after = state_of(client)
        assert after.upper == 1 and after.trace == before.trace
        beat = after.writers[write.writer_id].last_heartbeat_ms
        assert beat > before.writers[write.writer_id].last_heartbeat_ms
        with nothing_committed(client):
            stranger.compare_and_append([], 1, 1)  # never registered: nothing to extend
        with nothing_committed(client), pytest.raises(UpperMismatch) as info:
            write.compare_and_append([], 0, 0)
        assert (info.value.expected, info.value.current) == (0, 1)
        with nothing_committed(client), pytest.raises(InvalidBounds):
            write.compare_and_append([upd(b"b", 1)], 1, 1)  # updates over nothing
        assert snapshot(client, 0) == [upd(b"a", 0)]
