"""Pure transitions, one test per rule (RFC 0015 §6.2, §6.3, §7.1, §7.5, §10, §13.1)."""

from __future__ import annotations

import pytest

from slatepy.errors import WriteStalled
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import (
    Indeterminate,
    InvalidBounds,
    OpaqueMismatch,
    UpperMismatch,
    UsageError,
)
from slatepy.persist.state.append import (
    AlreadyAppended,
    AlreadyCommitted,
    Appended,
    AppendFrom,
    CompareAndAppend,
    append_case,
    check_batch_age,
    check_batch_covers,
    compare_and_append,
)
from slatepy.persist.state.outcome import Break, Change
from slatepy.persist.state.records import CriticalReader, InlinePart, State
from slatepy.persist.state.transitions import (
    AddRollup,
    CompareAndDowngradeSince,
    DowngradeSince,
    ExpireCriticalReader,
    ExpireLeasedReader,
    ExpireWriter,
    Finalize,
    HeartbeatLeasedReader,
    HeartbeatWriter,
    RegisterCriticalReader,
    RegisterLeasedReader,
    RegisterWriter,
    add_rollup,
    compare_and_downgrade_since,
    downgrade_since,
    expire_at,
    expire_critical_reader,
    expire_leased_reader,
    expire_writer,
    finalize,
    heartbeat_leased_reader,
    heartbeat_writer,
    register_critical_reader,
    register_leased_reader,
    register_writer,
    step,
)
from slatepy.persist.validate import check_updates
from tests.persist.state_kit import (
    SETTINGS,
    append,
    commit,
    hollow_runs,
    initial,
    inline_runs,
    noop,
    refused,
    rollup_ref,
    with_writer,
)

U1 = [((b"k", b"v"), 0, 1)]


def caa(
    writer_id: str = "w1",
    token: str = "tok",
    expected: int = 0,
    new: int | None = 1,
    *,
    registered: bool = True,
    uncertain: bool = False,
) -> CompareAndAppend:
    return CompareAndAppend(
        writer_id=writer_id,
        token=token,
        expected=expected,
        new=new,
        runs=inline_runs([((b"k", b"v"), expected, 1)]),
        registered=registered,
        uncertain=uncertain,
    )


def leased(state: State, reader_id: str = "r1") -> State:
    return commit(state, register_leased_reader, RegisterLeasedReader(reader_id)).state


def critical(state: State, reader_id: str = "c1") -> State:
    return commit(state, register_critical_reader, RegisterCriticalReader(reader_id)).state


# --- registration and leases -------------------------------------------------------------


def test_register_writer_adds_a_leased_entry_once() -> None:
    change = commit(initial(), register_writer, RegisterWriter("w1", debug="host:1"), now=500)
    writer = change.state.writers["w1"]
    assert change.result == writer
    assert (writer.last_heartbeat_ms, writer.lease_ms) == (500, SETTINGS.writer_lease_ms)
    assert (writer.most_recent_token, writer.most_recent_upper, writer.debug) == ("", 0, "host:1")
    assert noop(change.state, register_writer, RegisterWriter("w1")) == writer


def test_register_writer_refuses_beyond_max_handles() -> None:
    settings = PersistSettings(max_handles=1)
    state = with_writer(initial(), "w1")
    error = refused(state, register_writer, RegisterWriter("w2"), settings=settings)
    assert isinstance(error, UsageError)


def test_register_leased_reader_holds_the_since_and_the_new_seqno() -> None:
    state = append(with_writer(initial()), 0, 5, U1)
    change = commit(state, register_leased_reader, RegisterLeasedReader("r1"))
    reader = change.state.leased_readers["r1"]
    assert (reader.since, reader.seqno) == (state.since, state.seqno + 1)
    assert reader.lease_ms == SETTINGS.reader_lease_ms
    assert noop(change.state, register_leased_reader, RegisterLeasedReader("r1")) == reader


def test_register_leased_reader_refuses_beyond_max_handles() -> None:
    settings = PersistSettings(max_handles=1)
    state = leased(initial(), "r1")
    error = refused(state, register_leased_reader, RegisterLeasedReader("r2"), settings=settings)
    assert isinstance(error, UsageError)


def test_critical_registration_is_once_per_reader_id_and_never_resets() -> None:
    state = critical(initial(), "c1")
    assert state.critical_readers["c1"] == CriticalReader(since=0, opaque=b"")
    args = CompareAndDowngradeSince("c1", b"", b"epoch-2", 7)
    state = commit(state, compare_and_downgrade_since, args).state
    again = noop(state, register_critical_reader, RegisterCriticalReader("c1"))
    assert again == CriticalReader(since=7, opaque=b"epoch-2")


def test_critical_registration_refuses_an_invalid_id() -> None:
    error = refused(initial(), register_critical_reader, RegisterCriticalReader("a/b"))
    assert isinstance(error, UsageError)


def test_heartbeat_writer_stamps_the_walltime() -> None:
    state = with_writer(initial(), now=10)
    change = commit(state, heartbeat_writer, HeartbeatWriter("w1"), now=5000)
    assert change.state.writers["w1"].last_heartbeat_ms == 5000 == change.state.walltime_ms


def test_heartbeat_of_an_expired_writer_is_a_usage_error() -> None:
    state = with_writer(initial(), now=10)
    late = 10 + SETTINGS.writer_lease_ms + 1
    error = refused(state, heartbeat_writer, HeartbeatWriter("w1"), now=late)
    assert isinstance(error, UsageError) and "lease expired" in str(error)


def test_heartbeat_leased_reader_moves_its_seqno_forward_only() -> None:
    state = leased(initial())  # holds seqno 1
    state = append(with_writer(state), 0, 3, U1)
    beat = commit(state, heartbeat_leased_reader, HeartbeatLeasedReader("r1", 99))
    assert beat.result.seqno == state.seqno + 1  # clamped to the new state's seqno
    back = commit(beat.state, heartbeat_leased_reader, HeartbeatLeasedReader("r1", 1))
    assert back.result.seqno == beat.result.seqno


def test_expire_at_drops_lapsed_leases_by_state_walltime() -> None:
    boundary = 10 + SETTINGS.writer_lease_ms
    state = with_writer(initial(), now=10)
    state = commit(
        state, register_leased_reader, RegisterLeasedReader("r1"), now=boundary - 9
    ).state
    assert expire_at(state, boundary) is state  # heartbeat + lease == walltime: still alive
    expired = expire_at(state, boundary + 1)
    assert "w1" not in expired.writers and "r1" in expired.leased_readers
    assert expired.seqno == state.seqno  # the next transition commits it


def test_expiry_recomputes_since_as_the_meet_never_below_the_old_since() -> None:
    state = leased(initial(), "old")  # since 0, heartbeat at walltime 1
    state = commit(state, register_leased_reader, RegisterLeasedReader("young"), now=100_000).state
    state = commit(state, downgrade_since, DowngradeSince("young", 8), now=100_001).state
    assert state.since == 0
    late = 1 + SETTINGS.reader_lease_ms + 1
    expired = expire_at(state, late)
    assert list(expired.leased_readers) == ["young"] and expired.since == 8
    # With every reader gone, the since stays where they left it.
    assert expire_at(expired, late + SETTINGS.reader_lease_ms).since == 8


def test_downgrade_since_moves_forward() -> None:
    change = commit(leased(initial()), downgrade_since, DowngradeSince("r1", 4))
    assert change.result == 4 and change.state.since == 4
    assert change.state.leased_readers["r1"].since == 4


def test_downgrade_since_backwards_is_a_no_op_returning_the_since() -> None:
    state = commit(leased(initial()), downgrade_since, DowngradeSince("r1", 4)).state
    assert noop(state, downgrade_since, DowngradeSince("r1", 2)) == 4
    assert noop(state, downgrade_since, DowngradeSince("r1", 4)) == 4


def test_downgrade_since_to_none() -> None:
    change = commit(leased(initial()), downgrade_since, DowngradeSince("r1", None))
    assert change.result is None and change.state.since is None
    assert noop(change.state, downgrade_since, DowngradeSince("r1", 9)) is None


def test_downgrade_since_of_an_unregistered_reader_is_a_usage_error() -> None:
    assert isinstance(refused(initial(), downgrade_since, DowngradeSince("r1", 3)), UsageError)


def test_since_is_the_meet_of_leased_readers() -> None:
    state = leased(leased(initial(), "a"), "b")
    state = commit(state, downgrade_since, DowngradeSince("a", 9)).state
    assert state.since == 0
    state = commit(state, downgrade_since, DowngradeSince("b", 5)).state
    assert state.since == 5


def test_since_is_the_meet_of_critical_readers() -> None:
    state = critical(critical(initial(), "a"), "b")
    state = commit(state, compare_and_downgrade_since, CompareAndDowngradeSince("a", b"", b"", 9))
    state = state.state
    assert state.since == 0
    state = commit(
        state, compare_and_downgrade_since, CompareAndDowngradeSince("b", b"", b"", 12)
    ).state
    assert state.since == 9


def test_since_is_the_meet_of_leased_and_critical_readers() -> None:
    state = critical(leased(initial(), "r"), "c")
    state = commit(state, downgrade_since, DowngradeSince("r", None)).state
    assert state.since == 0  # the critical reader holds it
    state = commit(
        state, compare_and_downgrade_since, CompareAndDowngradeSince("c", b"", b"x", 6)
    ).state
    assert state.since == 6
    state = commit(state, expire_critical_reader, ExpireCriticalReader("c")).state
    assert state.since is None


def test_opaque_mismatch_changes_nothing() -> None:
    state = critical(initial())
    error = refused(
        state, compare_and_downgrade_since, CompareAndDowngradeSince("c1", b"other", b"x", 5)
    )
    assert isinstance(error, OpaqueMismatch)
    assert (error.expected, error.current) == (b"other", b"")


def test_opaque_is_stored_even_when_the_since_does_not_move() -> None:
    state = critical(initial())
    state = commit(
        state, compare_and_downgrade_since, CompareAndDowngradeSince("c1", b"", b"a", 5)
    ).state
    change = commit(
        state, compare_and_downgrade_since, CompareAndDowngradeSince("c1", b"a", b"b", 3)
    )
    assert change.result == 5 and change.state.critical_readers["c1"].opaque == b"b"
    assert change.state.since == 5


def test_compare_and_downgrade_with_nothing_to_change_is_a_no_op() -> None:
    state = critical(initial())
    assert (
        noop(state, compare_and_downgrade_since, CompareAndDowngradeSince("c1", b"", b"", 0)) == 0
    )


def test_compare_and_downgrade_refuses_non_bytes_and_unregistered_readers() -> None:
    state = critical(initial())
    args = CompareAndDowngradeSince("c1", "", b"", 1)  # type: ignore[arg-type]
    assert isinstance(refused(state, compare_and_downgrade_since, args), UsageError)
    args = CompareAndDowngradeSince("c2", b"", b"", 1)
    assert isinstance(refused(state, compare_and_downgrade_since, args), UsageError)


def test_expire_handles_removes_them_once() -> None:
    state = critical(leased(with_writer(initial())))
    state = commit(state, downgrade_since, DowngradeSince("r1", 3)).state
    state = commit(state, expire_writer, ExpireWriter("w1")).state
    assert noop(state, expire_writer, ExpireWriter("w1")) is False
    state = commit(state, expire_critical_reader, ExpireCriticalReader("c1")).state
    assert (
        state.since == 3
        and noop(state, expire_critical_reader, ExpireCriticalReader("c1")) is False
    )
    state = commit(state, expire_leased_reader, ExpireLeasedReader("r1")).state
    assert not state.has_readers() and state.since == 3
    assert noop(state, expire_leased_reader, ExpireLeasedReader("r1")) is False


# --- compare_and_append ------------------------------------------------------------------


def test_caa_success_appends_and_registers_the_writer() -> None:
    change = commit(initial(), compare_and_append, caa(registered=False), now=70)
    assert change.result == Appended(1)
    state = change.state
    assert state.upper == 1 and len(state.trace) == 1
    batch = state.trace[0]
    assert (batch.desc.lower, batch.desc.upper, batch.desc.since, batch.updates) == (0, 1, 0, 1)
    writer = state.writers["w1"]
    assert (writer.most_recent_token, writer.most_recent_upper) == ("tok", 1)
    assert writer.last_heartbeat_ms == 70


def test_caa_already_committed_by_token() -> None:
    state = commit(initial(), compare_and_append, caa(registered=False)).state
    result = noop(state, compare_and_append, caa(uncertain=True))
    assert result == AlreadyCommitted(1)


def test_caa_upper_mismatch() -> None:
    state = append(with_writer(initial()), 0, 5, U1)
    error = refused(state, compare_and_append, caa(token="t2", expected=3, new=7))
    assert isinstance(error, UpperMismatch) and (error.expected, error.current) == (3, 5)


def test_caa_on_a_closed_shard_is_an_upper_mismatch_with_current_none() -> None:
    state = append(with_writer(initial()), 0, None, U1)
    error = refused(state, compare_and_append, caa(token="t2", expected=3, new=7))
    assert isinstance(error, UpperMismatch) and (error.expected, error.current) == (3, None)


def test_caa_by_an_expired_writer_is_a_usage_error() -> None:
    error = refused(initial(), compare_and_append, caa(registered=True))
    assert isinstance(error, UsageError) and "lease expired" in str(error)


def test_caa_invalid_bounds_is_checked_before_the_upper() -> None:
    state = append(with_writer(initial()), 0, 5, U1)
    for expected, new in [(3, 3), (3, 2)]:
        error = refused(state, compare_and_append, caa(token="t2", expected=expected, new=new))
        assert type(error) is InvalidBounds


def test_caa_update_time_outside_bounds_is_a_usage_error() -> None:
    # The handle checks updates against [expected, new) before writing any part.
    with pytest.raises(UsageError, match="outside"):
        check_updates([((b"k", b""), 5, 1)], 0, 5)


def test_caa_refuses_runs_with_an_empty_part() -> None:
    args = CompareAndAppend("w1", "t", 0, 1, ((InlinePart(b"", 0),),), registered=False)
    assert isinstance(refused(initial(), compare_and_append, args), UsageError)


def test_caa_empty_append_merges_into_the_empty_batch_before_it() -> None:
    big = hollow_runs("part/w1/a.sst", 5000, 0, 0)
    state = append(with_writer(initial()), 0, 1, runs=big)
    state = append(state, 1, 2)
    assert [(b.desc.lower, b.desc.upper, b.is_empty) for b in state.trace] == [
        (0, 1, False),
        (1, 2, True),
    ]
    state = append(state, 2, 3)
    state = append(state, 3, 4)
    assert [(b.desc.lower, b.desc.upper, b.is_empty) for b in state.trace] == [
        (0, 1, False),
        (1, 4, True),
    ]


def test_caa_empty_append_extends_a_small_batch_before_it() -> None:
    state = append(with_writer(initial()), 0, 1, U1)
    runs = state.trace[0].runs
    state = append(append(state, 1, 2), 2, 3)
    assert len(state.trace) == 1
    assert (state.trace[0].desc.lower, state.trace[0].desc.upper) == (0, 3)
    assert state.trace[0].runs == runs


def test_caa_stalls_at_max_trace_batches() -> None:
    settings = PersistSettings(max_trace_batches=8, compaction="off")
    state = with_writer(initial())
    for t in range(8):
        state = append(state, t, t + 1, [((b"k", b""), t, 1)], settings=settings)
    assert len(state.trace) == 8
    error = refused(
        state, compare_and_append, caa(token="t9", expected=8, new=9), settings=settings
    )
    assert isinstance(error, WriteStalled)
    # Progress-only appends go on: empty batches merge with each other.
    state = append(append(state, 8, 9, settings=settings), 9, 10, settings=settings)
    assert len(state.trace) == 9


def test_caa_needs_an_idempotency_token() -> None:
    error = refused(initial(), compare_and_append, caa(token="", registered=False))
    assert isinstance(error, UsageError) and "token" in str(error)


# The idempotency decision table of §6.2, for a retry after an indefinite failure.


def test_idempotency_token_present_means_committed() -> None:
    state = commit(with_writer(initial()), compare_and_append, caa()).state
    assert noop(state, compare_and_append, caa(uncertain=True)) == AlreadyCommitted(1)


def test_idempotency_upper_still_expected_means_not_committed_append_now() -> None:
    change = commit(with_writer(initial()), compare_and_append, caa(uncertain=True))
    assert change.result == Appended(1)


def test_idempotency_other_token_means_not_committed_upper_mismatch() -> None:
    state = commit(with_writer(initial(), "w2"), compare_and_append, caa("w2", "other")).state
    state = with_writer(state, "w1")
    error = refused(state, compare_and_append, caa(uncertain=True))
    assert isinstance(error, UpperMismatch) and error.current == 1


def test_idempotency_writer_gone_means_indeterminate() -> None:
    state = commit(initial(), compare_and_append, caa("w2", "other", registered=False)).state
    for registered in (True, False):
        error = refused(state, compare_and_append, caa(registered=registered, uncertain=True))
        assert isinstance(error, Indeterminate) and error.definite is False


def test_idempotency_writer_gone_but_upper_expected_is_a_definite_answer() -> None:
    # Not committed (the upper would have moved); the lease expired: a usage error.
    error = refused(initial(), compare_and_append, caa(registered=True, uncertain=True))
    assert type(error) is UsageError


# --- append's four cases (§6.3) and batches (§6.4) ----------------------------------------


def test_append_case_upper_at_lower_appends() -> None:
    assert append_case(5, 5, 9) == AppendFrom(5, narrowed=False)


def test_append_case_upper_inside_appends_the_rest() -> None:
    assert append_case(7, 5, 9) == AppendFrom(7, narrowed=True)
    assert append_case(7, 5, None) == AppendFrom(7, narrowed=True)


def test_append_case_upper_at_or_beyond_upper_does_nothing() -> None:
    assert append_case(9, 5, 9) == AlreadyAppended(9)
    assert append_case(12, 5, 9) == AlreadyAppended(12)


def test_append_case_upper_before_lower_is_a_mismatch() -> None:
    with pytest.raises(UpperMismatch) as caught:
        append_case(3, 5, 9)
    assert (caught.value.expected, caught.value.current) == (5, 3)


def test_append_case_on_a_closed_shard_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="closed"):
        append_case(None, 5, 9)


def test_append_case_checks_bounds_first() -> None:
    with pytest.raises(InvalidBounds):
        append_case(None, 9, 9)


def test_batch_covers_its_application_range() -> None:
    assert check_batch_covers(0, 10, 0, 10) is False
    assert check_batch_covers(0, 10, 2, 10) is True
    assert check_batch_covers(0, None, 2, None) is True
    assert check_batch_covers(0, None, 0, 5) is True


@pytest.mark.parametrize(("expected", "new"), [(0, 10), (1, 11), (1, None), (0, 5)])
def test_batch_not_covering_its_application_range_is_a_usage_error(
    expected: int, new: int | None
) -> None:
    with pytest.raises(UsageError, match="cover"):
        check_batch_covers(1, 10, expected, new)


def test_batch_application_checks_bounds_first() -> None:
    with pytest.raises(InvalidBounds):
        check_batch_covers(7, 10, 5, 5)


def test_batch_may_be_applied_only_within_half_its_lease() -> None:
    check_batch_age(0, SETTINGS.batch_lease_ms // 2, SETTINGS)
    with pytest.raises(UsageError, match="too old"):
        check_batch_age(0, SETTINGS.batch_lease_ms // 2 + 1, SETTINGS)


# --- finalize and rollups ---------------------------------------------------------------


def test_finalize_needs_since_and_upper_none() -> None:
    state = append(with_writer(initial()), 0, 5, U1)
    assert isinstance(refused(state, finalize, Finalize()), UsageError)
    state = append(state, 5, None)
    assert isinstance(refused(state, finalize, Finalize()), UsageError)  # since is 0


def closed_and_released() -> State:
    state = critical(append(with_writer(initial()), 0, None, U1))
    args = CompareAndDowngradeSince("c1", b"", b"", None)
    return commit(state, compare_and_downgrade_since, args).state


def test_finalize_clears_everything_and_is_idempotent() -> None:
    change = commit(closed_and_released(), finalize, Finalize())
    state = change.state
    assert state.finalized and state.trace == () and not state.writers and not state.has_readers()
    assert noop(state, finalize, Finalize()) is None


def test_finalized_shard_accepts_no_handles_or_writes() -> None:
    state = commit(closed_and_released(), finalize, Finalize()).state
    for transition, args in [
        (register_writer, RegisterWriter("w9")),
        (register_leased_reader, RegisterLeasedReader("r9")),
        (register_critical_reader, RegisterCriticalReader("c9")),
    ]:
        assert isinstance(refused(state, transition, args), UsageError)  # type: ignore[arg-type]
    error = refused(state, compare_and_append, caa("w9", registered=False))
    assert isinstance(error, UpperMismatch) and error.current is None


def test_add_rollup_registers_it_once() -> None:
    state = append(with_writer(initial()), 0, 5, U1)
    change = commit(state, add_rollup, AddRollup(2, rollup_ref(2)))
    assert change.result is True and change.state.latest_rollup() == (2, rollup_ref(2))
    assert noop(change.state, add_rollup, AddRollup(2, rollup_ref(2))) is False


def test_add_rollup_refuses_seqnos_it_cannot_hold() -> None:
    state = append(with_writer(initial()), 0, 5, U1)
    for seqno, ref in [(0, rollup_ref(0)), (state.seqno + 1, rollup_ref(state.seqno + 1))]:
        assert isinstance(refused(state, add_rollup, AddRollup(seqno, ref)), UsageError)
    assert isinstance(refused(state, add_rollup, AddRollup(1, rollup_ref(2))), UsageError)


def test_a_change_commits_the_expiry_a_break_does_not() -> None:
    state = with_writer(initial(), "w1", now=10)
    late = 10 + SETTINGS.writer_lease_ms + 1
    state = commit(state, register_leased_reader, RegisterLeasedReader("r1"), now=late - 5).state
    # A Break (downgrade backwards) commits nothing, expiry included.
    assert noop(state, downgrade_since, DowngradeSince("r1", 0), now=late) == 0
    # A Change of another handle commits the writer's expiry with it.
    change = commit(state, downgrade_since, DowngradeSince("r1", 2), now=late)
    assert isinstance(change, Change) and "w1" not in change.state.writers


def test_a_break_answers_its_value_or_raises_its_error() -> None:
    state = commit(initial(), compare_and_append, caa(registered=False)).state
    retry = step(state, state.walltime_ms + 1, SETTINGS, compare_and_append, caa(uncertain=True))
    assert isinstance(retry, Break) and retry.answer() == AlreadyCommitted(1)
    stale = step(state, state.walltime_ms + 1, SETTINGS, compare_and_append, caa(token="t2"))
    assert isinstance(stale, Break)
    with pytest.raises(UpperMismatch):
        stale.answer()
