"""External idempotency keys recorded with an append, and batches applied forwarded above
the times they were written at (RFC 0015 Addendum E): the pure transition, the state
encoding, and the write handle (two writers minting ranges, a lost reply, a replay from a
new process)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from slatepy.errors import CorruptionError
from slatepy.persist import (
    PersistClient,
    PersistSettings,
    Updates,
    UpperMismatch,
    UsageError,
)
from slatepy.persist.location.objconsensus import ObjectConsensus
from slatepy.persist.state.append import (
    AlreadyApplied,
    Appended,
    CompareAndAppend,
    compare_and_append,
)
from slatepy.persist.state.records import Applied, Desc, HollowBatch, Window, forward_runs
from slatepy.store import open_store
from slatepy.testing.faults import FaultRates
from slatepy.testing.persist_faults import FaultyConsensus
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    TEST_SETTINGS,
    client_fixture,
    state_of,
    url_fixture,
    validate_states,
)
from tests.persist.state_kit import (
    append,
    commit,
    hollow_runs,
    initial,
    inline_runs,
    noop,
    refused,
)

# --- the pure transition -------------------------------------------------------------


def cas(
    expected: int,
    new: int | None,
    key: tuple[str, int] | None,
    *,
    writer_id: str = "w1",
    token: str = "t",
    registered: bool = False,
    updates: list[tuple[tuple[bytes, bytes], int, int]] | None = None,
) -> CompareAndAppend:
    return CompareAndAppend(
        writer_id=writer_id,
        token=token,
        expected=expected,
        new=new,
        runs=inline_runs(updates or [((b"k", b"v"), expected, 1)]),
        registered=registered,
        idempotency=key,
    )


def test_the_key_is_recorded_with_the_append_and_round_trips_through_the_diff() -> None:
    change = commit(initial(), compare_and_append, cas(0, 1, ("q1", 0)))
    assert isinstance(change.result, Appended)
    state = change.state
    assert state.idempotency == {"q1": Applied(0, 1, state.walltime_ms)}
    # commit() checked validate, the step rules and the diff's encode/decode/apply.


def test_a_replay_of_a_recorded_id_is_already_applied_whatever_its_uppers() -> None:
    state = commit(initial(), compare_and_append, cas(0, 1, ("q1", 0))).state
    state = append(state, 1, 5, writer_id="w2")  # another writer moved on
    # The replay comes from a new process (another writer id), with other uppers.
    for expected, new in ((1, 2), (5, 6), (0, 1)):
        value = noop(state, compare_and_append, cas(expected, new, ("q1", 0), writer_id="w9"))
        assert value == AlreadyApplied(0, 1)
    # An older id of the key is applied too (ids grow with each logical append).
    state = commit(state, compare_and_append, cas(5, 6, ("q1", 3), writer_id="w9")).state
    assert noop(state, compare_and_append, cas(6, 7, ("q1", 2), writer_id="w8")) == (
        AlreadyApplied(3, 6)
    )
    assert "w9" in state.writers and "w8" not in state.writers


def test_a_new_id_or_another_key_appends_only_at_the_upper() -> None:
    state = commit(initial(), compare_and_append, cas(0, 1, ("q1", 0))).state
    error = refused(state, compare_and_append, cas(0, 1, ("q1", 1), token="t2"))
    assert isinstance(error, UpperMismatch) and error.current == 1
    state = commit(state, compare_and_append, cas(1, 2, ("q2", 0), token="t3")).state
    assert set(state.idempotency) == {"q1", "q2"}


def test_a_malformed_key_is_a_usage_error() -> None:
    for bad in (("", 1), ("q", -1), ("q", True), ("q" * 257, 0), ("q", 1 << 64)):
        error = refused(initial(), compare_and_append, cas(0, 1, bad))  # type: ignore[arg-type]
        assert isinstance(error, UsageError)


def test_keys_expire_after_the_ttl_and_are_evicted_beyond_the_maximum() -> None:
    settings = PersistSettings(idempotency_ttl=10.0, max_idempotency_keys=3)
    state = initial()
    now = 1_000
    for i in range(4):
        now += 1_000
        args = cas(i, i + 1, (f"q{i}", 0), token=f"t{i}", writer_id="w1", registered=i > 0)
        state = commit(state, compare_and_append, args, now=now, settings=settings).state
    assert set(state.idempotency) == {"q1", "q2", "q3"}  # q0 evicted, least recent
    # Past the TTL the next append drops every stale key but its own.
    now += 20_000
    args = cas(4, 5, ("q4", 0), token="t4", writer_id="w1", registered=True)
    state = commit(state, compare_and_append, args, now=now, settings=settings).state
    assert set(state.idempotency) == {"q4"}
    # An expired key is forgotten: its replay appends again (the documented bound).
    stale = commit(
        state,
        compare_and_append,
        cas(5, 6, ("q3", 0), token="t5", writer_id="w1", registered=True),
        now=now + 1,
        settings=settings,
    )
    assert isinstance(stale.result, Appended)


def test_validate_rejects_a_key_from_the_future_and_finalize_clears_keys() -> None:
    state = commit(initial(), compare_and_append, cas(0, 1, ("q1", 0))).state
    bad = msgspec.structs.replace(state, idempotency={"q1": Applied(0, 1, state.walltime_ms + 5)})
    with pytest.raises(CorruptionError, match="idempotency key"):
        bad.validate()


def test_forwarded_parts_validate_against_their_batch() -> None:
    runs = hollow_runs("part/w/" + "a" * 32 + ".sst", 3, t_min=0, t_max=2)
    forwarded = forward_runs(runs, 7, 9)
    (part,) = forwarded[0]
    assert part.forward == 7 and part.window == Window(0, 9)
    state = append(initial(), 0, 7, writer_id="w1")
    state = append(state, 7, 9, runs=forwarded, writer_id="w1", token="t9")
    assert state.trace[-1].desc.upper == 9  # (merged with its empty neighbour)
    assert [p.forward for b in state.trace for p in b.parts()] == [7]
    outside = HollowBatch(state.next_batch_id, Desc(9, 12), forward_runs(runs, 8, 12), 3)
    bad = msgspec.structs.replace(
        state, trace=(*state.trace, outside), next_batch_id=outside.id + 1, upper=12
    )
    with pytest.raises(CorruptionError, match="window outside its desc"):
        bad.validate()


# --- the write handle ----------------------------------------------------------------


def upd(key: bytes, time: int) -> tuple[tuple[bytes, bytes], int, int]:
    return (key, b"v"), time, 1


def read_all(client: PersistClient) -> list[tuple[tuple[bytes, bytes], int, int]]:
    """Every update of the shard at its own time (a subscribe from 0 up to the upper)."""
    upper = state_of(client).upper
    assert upper is not None
    reader = client.open_leased_reader(SHARD)
    got: list[tuple[tuple[bytes, bytes], int, int]] = []
    try:
        listen = reader.subscribe(0)
        while listen.frontier is not None and listen.frontier < upper:
            for event in listen.fetch_next(timeout=10):
                if isinstance(event, Updates):
                    got.extend(event.updates)
        listen.close()
        return sorted(got)
    finally:
        reader.expire()


def sink_commit(
    client: PersistClient, key: str, batch_id: int, rows: list[bytes], *, time: int
) -> bool:
    """What the Spark sink does: write a batch at ``time``, mint ``[upper, max+1)`` at
    commit and apply it forwarded with ``(key, batch_id)``; re-mint on a mismatch."""
    write = client.open_writer(SHARD)
    builder = write.builder(0)
    for row in rows:
        builder.add(row, b"v", time, 1)
    batch = builder.finish(None)
    upper = write.fetch_recent_upper()
    for _ in range(10):
        assert upper is not None
        try:
            applied = write.compare_and_append_batch(
                [batch], upper, max(upper, time) + 1, idempotency=(key, batch_id), forward=True
            )
        except UpperMismatch as exc:
            upper = exc.current
            continue
        if not applied:
            batch.delete()
        return applied
    raise AssertionError("no progress")


def test_two_writers_mint_ranges_at_commit_and_forward_their_batches(
    client: PersistClient,
) -> None:
    assert sink_commit(client, "qa", 0, [b"a0"], time=0)
    assert sink_commit(client, "qa", 1, [b"a1"], time=1)
    # qb's batch 0 was written at time 0, below the upper 2: it lands forwarded to 2.
    assert sink_commit(client, "qb", 0, [b"b0", b"b0x"], time=0)
    assert state_of(client).upper == 3
    # Replays of both keys, even with other uppers, append nothing.
    assert not sink_commit(client, "qa", 1, [b"a1"], time=1)
    assert not sink_commit(client, "qb", 0, [b"b0", b"b0x"], time=0)
    assert read_all(client) == [upd(b"a0", 0), upd(b"a1", 1), upd(b"b0", 2), upd(b"b0x", 2)]
    assert state_of(client).upper == 3


def test_a_stale_mint_is_an_upper_mismatch_and_the_batch_stays_usable(
    client: PersistClient,
) -> None:
    write, other = client.open_writer(SHARD), client.open_writer(SHARD)
    batch = write.batch([upd(b"x", 0)], 0, None)
    other.compare_and_append([upd(b"o", 0)], 0, 4)
    with pytest.raises(UpperMismatch):
        write.compare_and_append_batch([batch], 0, 1, idempotency=("q", 0), forward=True)
    assert "q" not in state_of(client).idempotency
    assert write.compare_and_append_batch([batch], 4, 5, idempotency=("q", 0), forward=True)
    assert read_all(client) == [upd(b"o", 0), upd(b"x", 4)]


def test_forwarding_needs_the_batch_to_reach_the_new_upper(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    batch = write.batch([upd(b"x", 0)], 0, 2)
    with pytest.raises(UsageError, match="forwarded up to 3"):
        write.compare_and_append_batch([batch], 0, 3, forward=True)
    with pytest.raises(UsageError, match="idempotency"):
        write.compare_and_append_batch([batch], 0, 1, idempotency=("", 0))


def test_forwarded_updates_survive_compaction(url: str) -> None:
    with PersistClient.open(url, settings=TEST_SETTINGS) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"base", 0)], 0, 10)
        for i in range(6):
            batch = write.batch([upd(b"k%d" % i, 0), upd(b"k%d" % i, 1)], 0, None)
            write.compare_and_append_batch([batch], 10 + i, 11 + i, forward=True)
        client.machine(SHARD).wait_until(lambda s: len(s.trace) < 7, 30)
        got = read_all(client)
    expected = [upd(b"base", 0)] + [((b"k%d" % i, b"v"), 10 + i, 2) for i in range(6)]
    assert got == expected


def test_a_lost_reply_is_answered_by_the_recorded_key(tmp_path: Path) -> None:
    inner = ObjectConsensus(open_store(f"file://{tmp_path}"), min_age=0)
    faulty = FaultyConsensus(inner, {"compare_and_set": FaultRates(lost_reply=1.0)})
    faulty.enabled = False
    url = f"file://{tmp_path}"
    with PersistClient.open(url, consensus=faulty, settings=TEST_SETTINGS) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([], 0, 1)
        batch = write.batch([upd(b"x", 1)], 1, None)
        faulty.enabled = True
        # The CAS lands, its reply is lost; the handle's retry finds it landed.
        assert write.compare_and_append_batch([batch], 1, 2, idempotency=("q", 7), forward=True)
        assert faulty.counts.get("compare_and_set:lost_reply", 0) >= 1
        faulty.enabled = False
        shipped = batch.to_bytes()
    # A new process (new client, new writer) replays the call with the same batch: that
    # append landed and it is its own (issue 27 defect 3: False told it to delete parts
    # the state references). Another batch under the key: already applied, not referenced.
    with PersistClient.open(url, consensus=inner, settings=TEST_SETTINGS) as client:
        write = client.open_writer(SHARD)
        again = write.batch_from_bytes(shipped)
        assert write.compare_and_append_batch([again], 5, 6, idempotency=("q", 7), forward=True)
        other = write.batch([upd(b"y", 1)], 1, None)
        assert not write.compare_and_append_batch([other], 5, 6, idempotency=("q", 7), forward=True)
        other.delete()
        assert read_all(client) == [upd(b"x", 1)]
        assert state_of(client).idempotency["q"].id == 7
    inner.close()


def test_builder_extend_checks_a_whole_call_and_spills_full_buffers(url: str) -> None:
    from slatepy.persist import PersistSettings as Settings

    settings = Settings(
        batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True, builder_buffer_bytes=2048
    )
    with PersistClient.open(url, settings=settings) as client:
        write = client.open_writer(SHARD)
        builder = write.builder(0)
        with pytest.raises(UsageError):
            builder.extend([upd(b"ok", 1), ((b"bad", "not bytes"), 1, 1)])  # type: ignore[list-item]
        assert builder.max_time is None  # nothing of the failed call was added
        for first in range(0, 100, 10):  # the buffer is checked after each call
            builder.extend([upd(b"k%03d" % i, i % 5) for i in range(first, first + 10)])
        assert builder.max_time == 4
        batch = builder.finish(None)
        assert len(batch.record.runs) > 1  # spilled as runs along the way
        assert write.compare_and_append_batch([batch], 0, 5, forward=True)
        assert len(read_all(client)) == 100
