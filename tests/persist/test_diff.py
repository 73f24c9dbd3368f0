"""State diffs: ``between``/``apply``, their checks, the encoding and the digest chain
(RFC 0015 §4.2)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from msgspec import UNSET

from slatepy.errors import CorruptionError, InvalidArgument, UnsupportedFormatVersion
from slatepy.format.envelope import seal, unseal
from slatepy.persist.state.diff import (
    Put,
    Remove,
    StateDiff,
    apply,
    check_chain,
    decode_state_diff,
    encode_state_diff,
    entry_digest,
)
from slatepy.persist.state.gc_rules import ClaimGc, CompleteGc, claim_gc, complete_gc
from slatepy.persist.state.records import State, encode_rollup
from slatepy.persist.state.transitions import (
    AddRollup,
    HeartbeatWriter,
    add_rollup,
    heartbeat_writer,
)
from tests.persist.state_kit import append, commit, initial, rollup_ref, with_writer


def between(old: State, new: State) -> StateDiff:
    return StateDiff.between(old, new, nonce="n" * 32, prev_digest=7)


def two_states() -> tuple[State, State]:
    old = append(with_writer(initial()), 0, 3, [((b"k", b""), 1, 1)])
    return old, append(old, 3, 5, [((b"k", b""), 4, 1)])


def test_diff_carries_only_what_changed() -> None:
    old = with_writer(initial())
    new = commit(old, heartbeat_writer, HeartbeatWriter("w1"), now=900).state
    diff = between(old, new)
    assert diff.writers == (Put("w1", new.writers["w1"]),)
    assert (diff.upper, diff.since, diff.finalized, diff.active_gc) == (UNSET,) * 4
    assert diff.trace_add == () and diff.trace_remove == ()
    assert (diff.seqno_from, diff.seqno_to, diff.walltime_ms) == (old.seqno, new.seqno, 900)
    assert (diff.nonce, diff.prev_digest) == ("n" * 32, 7)
    assert apply(old, diff) == new


def test_diff_of_an_append_and_a_merge() -> None:
    old, new = two_states()
    diff = between(old, new)
    assert [batch.id for batch in diff.trace_add] == [new.trace[-1].id]
    assert diff.upper == 5 and diff.next_batch_id == new.next_batch_id
    assert apply(old, diff) == new


def test_diff_sets_and_clears_optional_scalars() -> None:
    old = with_writer(initial())
    claimed = commit(old, claim_gc, ClaimGc("w1")).state
    diff = between(old, claimed)
    assert diff.active_gc == claimed.active_gc
    done = commit(claimed, complete_gc, CompleteGc("w1", claimed.seqno, None)).state
    diff = between(claimed, done)
    assert diff.active_gc is None and diff.last_gc_seqno == claimed.seqno
    assert apply(claimed, decode_state_diff(encode_state_diff(diff))) == done


def test_diff_removes_map_entries_and_names_the_latest_rollup() -> None:
    old, _ = two_states()
    with_rollup = commit(old, add_rollup, AddRollup(2, rollup_ref(2))).state
    diff = between(old, with_rollup)
    assert diff.rollups == (Put(2, rollup_ref(2)),)
    assert diff.latest_rollup == (2, rollup_ref(2))
    without = msgspec.structs.replace(
        with_rollup,
        seqno=with_rollup.seqno + 1,
        walltime_ms=with_rollup.walltime_ms + 1,
        writers={},
    )
    diff = between(with_rollup, without)
    assert diff.writers == (Remove("w1"),)
    assert apply(with_rollup, diff) == without


def test_between_refuses_unrelated_states_and_changed_batches() -> None:
    old, new = two_states()
    with pytest.raises(InvalidArgument):
        between(new, old)
    with pytest.raises(InvalidArgument):
        between(old, msgspec.structs.replace(new, shard_id="other"))
    changed = list(new.trace)
    changed[0] = msgspec.structs.replace(changed[0], updates=changed[0].updates + 1)
    with pytest.raises(InvalidArgument, match="changed under its id"):
        between(old, msgspec.structs.replace(new, trace=tuple(changed)))


def broken(diff: StateDiff, **changes: Any) -> StateDiff:
    return msgspec.structs.replace(diff, **changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"shard_id": "other"}, "of shard 'other'"),
        ({"seqno_from": 0}, "does not follow"),
        ({"seqno_to": 99}, "does not follow"),
        ({"walltime_ms": 0}, "is not after"),
        ({"trace_remove": (42,)}, "absent"),
        ({"writers": (Remove("nobody"),)}, "absent"),
        ({"latest_rollup": (1, rollup_ref(1))}, "another latest rollup"),
    ],
)
def test_apply_refuses_a_diff_that_does_not_fit(changes: dict[str, Any], message: str) -> None:
    old, new = two_states()
    with pytest.raises(CorruptionError, match=message):
        apply(old, broken(between(old, new), **changes))


def test_apply_refuses_a_batch_added_twice() -> None:
    old, new = two_states()
    diff = between(old, new)
    with pytest.raises(CorruptionError, match="twice"):
        apply(old, broken(diff, trace_add=(*diff.trace_add, old.trace[0])))


def test_encoding_round_trip_and_corruption() -> None:
    old, new = two_states()
    diff = between(old, new)
    data = encode_state_diff(diff)
    assert data[:4] == b"SLPD"
    assert decode_state_diff(data) == diff
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0x01
        with pytest.raises(CorruptionError) as caught:
            decode_state_diff(bytes(flipped), path="consensus/orders/3")
        assert caught.value.path == "consensus/orders/3"
    with pytest.raises(CorruptionError, match="magic"):
        decode_state_diff(encode_rollup(new))
    payload = unseal(data, b"SLPD", (1,), "diff")[1]
    # A newer slatepy's diff is no damage: the answer is to upgrade.
    with pytest.raises(UnsupportedFormatVersion, match="format version 2, this slatepy reads up"):
        decode_state_diff(seal(b"SLPD", 2, payload))


def test_digest_chain() -> None:
    first = StateDiff.between(initial(), with_writer(initial()), nonce="a", prev_digest=0)
    check_chain(None, first)
    entry = encode_state_diff(first)
    second_state = append(with_writer(initial()), 0, 1)
    second = StateDiff.between(
        with_writer(initial()), second_state, nonce="b", prev_digest=entry_digest(entry)
    )
    check_chain(entry, second)
    with pytest.raises(CorruptionError, match="chain") as caught:
        check_chain(encode_state_diff(broken(first, nonce="c")), second, path="x")
    assert caught.value.path == "x"
    with pytest.raises(CorruptionError):
        check_chain(None, second)
