"""State records: the invariants ``State.validate`` checks, windows, and the rollup
encoding (RFC 0015 §4.1, §4.3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from slatepy.errors import CorruptionError
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import UsageError
from slatepy.persist.ids import new_token, new_writer_id
from slatepy.persist.state.diff import StateDiff, encode_state_diff
from slatepy.persist.state.records import (
    Desc,
    GcClaim,
    HollowBatch,
    HollowPart,
    InlinePart,
    LeasedReader,
    MergeClaim,
    State,
    Window,
    decode_rollup,
    encode_rollup,
    narrow_runs,
)
from tests.persist.state_kit import (
    PAIRS,
    append,
    hollow_runs,
    initial,
    inline_runs,
    rollup_ref,
    with_writer,
)


def sample() -> State:
    """A state with two batches, a claim on them, a reader and a rollup."""
    state = with_writer(initial())
    state = append(state, 0, 3, runs=hollow_runs("part/w1/a.sst", 5, 0, 2), settings=PAIRS)
    state = append(state, 3, 7, [((b"k", b"v"), 4, 1)], settings=PAIRS)
    state = msgspec.structs.replace(
        state,
        leased_readers={"r1": LeasedReader(1, 0, 1, 1000)},
        rollups={2: rollup_ref(2)},
    )
    assert state.merges  # the two small batches are claimed
    return state


def test_initial_state() -> None:
    state = State.initial("orders")
    state.validate()
    assert (state.seqno, state.upper, state.since, state.trace) == (0, 0, 0, ())
    with pytest.raises(UsageError):
        State.initial("no/slashes")


def test_sample_is_valid() -> None:
    sample().validate()


def replace_batch(state: State, index: int, **changes: Any) -> State:
    trace = list(state.trace)
    trace[index] = msgspec.structs.replace(trace[index], **changes)
    return msgspec.structs.replace(state, trace=tuple(trace))


BROKEN: list[tuple[str, Callable[[State], State], str]] = [
    (
        "gap",
        lambda s: replace_batch(s, 1, desc=Desc(4, 7)),
        "breaks the trace",
    ),
    ("end", lambda s: msgspec.structs.replace(s, upper=9), "the trace ends at 7"),
    (
        "empty-trace",
        lambda s: msgspec.structs.replace(s, trace=(), merges={}),
        "no trace, but the upper",
    ),
    ("empty-desc", lambda s: replace_batch(s, 1, desc=Desc(3, 3)), "breaks the trace"),
    ("dup-id", lambda s: replace_batch(s, 1, id=1), "repeated"),
    ("id-ahead", lambda s: msgspec.structs.replace(s, next_batch_id=2), "next_batch_id"),
    ("since", lambda s: replace_batch(s, 0, desc=Desc(0, 3, 1)), "beyond since"),
    ("count", lambda s: replace_batch(s, 0, updates=6), "counts 6 updates"),
    (
        "zero-part",
        lambda s: replace_batch(s, 1, runs=((InlinePart(b"", 0),),), updates=0),
        "part without updates",
    ),
    (
        "window",
        lambda s: replace_batch(s, 1, runs=narrow_runs(s.trace[1].runs, 2, 5)),
        "window outside its desc",
    ),
    ("empty-run", lambda s: replace_batch(s, 1, runs=((),), updates=0), "run without parts"),
    (
        "claim-order",
        lambda s: msgspec.structs.replace(s, merges={1: MergeClaim((2, 1), "w1", 0, 1)}),
        "contiguous",
    ),
    (
        "claim-single",
        lambda s: msgspec.structs.replace(s, merges={1: MergeClaim((1,), "w1", 0, 1)}),
        "contiguous",
    ),
    (
        "claim-missing",
        lambda s: msgspec.structs.replace(s, merges={1: MergeClaim((2, 9), "w1", 0, 1)}),
        "contiguous",
    ),
    (
        "claim-twice",
        lambda s: msgspec.structs.replace(
            s,
            merges={1: MergeClaim((1, 2), "w", 0, 1), 2: MergeClaim((1, 2), "w", 0, 1)},
            next_merge_id=3,
        ),
        "another merge claims",
    ),
    ("claim-id", lambda s: msgspec.structs.replace(s, next_merge_id=1), "next_merge_id"),
    (
        "since-meet",
        lambda s: msgspec.structs.replace(s, since=None),
        "not the meet",
    ),
    (
        "reader-seqno",
        lambda s: msgspec.structs.replace(
            s, leased_readers={"r1": LeasedReader(s.seqno + 1, 0, 1, 1)}
        ),
        "from the future",
    ),
    (
        "rollup-seqno",
        lambda s: msgspec.structs.replace(s, rollups={s.seqno: rollup_ref(s.seqno)}),
        "earlier seqno",
    ),
    (
        "rollup-key",
        lambda s: msgspec.structs.replace(s, rollups={2: rollup_ref(1)}),
        "earlier seqno",
    ),
    (
        "gc",
        lambda s: msgspec.structs.replace(s, active_gc=GcClaim("w", s.seqno + 1, 0)),
        "from the future",
    ),
    ("last-gc", lambda s: msgspec.structs.replace(s, last_gc_seqno=s.seqno + 1), "future"),
    ("finalized", lambda s: msgspec.structs.replace(s, finalized=True), "finalized"),
    ("shard", lambda s: msgspec.structs.replace(s, shard_id="a b"), "invalid shard id"),
]


@pytest.mark.parametrize(("name", "breaks", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_validate_catches(name: str, breaks: Callable[[State], State], message: str) -> None:
    with pytest.raises(CorruptionError, match=message):
        breaks(sample()).validate()


def test_narrow_runs_intersects_windows_and_drops_empty_parts() -> None:
    part = HollowPart("part/w/a.sst", 10, 3, b"", 0, 9)
    windowed = msgspec.structs.replace(part, key="part/w/b.sst", window=Window(2, 5))
    runs = ((part, windowed), (windowed,))
    assert narrow_runs(runs, 4, None) == (
        (
            msgspec.structs.replace(part, window=Window(4, None)),
            msgspec.structs.replace(windowed, window=Window(4, 5)),
        ),
        (msgspec.structs.replace(windowed, window=Window(4, 5)),),
    )
    assert narrow_runs(runs, 6, 8) == ((msgspec.structs.replace(part, window=Window(6, 8)),),)
    assert Window(4, 5).contains(4) and not Window(4, 5).contains(5)


def test_batch_parts_and_state_helpers() -> None:
    state = sample()
    assert list(state.trace[0].part_keys()) == ["part/w1/a.sst"]
    assert list(state.trace[1].part_keys()) == []
    assert state.inline_bytes() == len(inline_runs([((b"k", b"v"), 4, 1)])[0][0].data)  # type: ignore[union-attr]
    assert state.latest_rollup() == (2, rollup_ref(2))
    assert initial().latest_rollup() is None
    assert HollowBatch(1, Desc(0, 1), (), 0).is_empty


def test_rollup_round_trip() -> None:
    state = sample()
    assert decode_rollup(encode_rollup(state)) == state


def test_rollup_corruption_is_detected_with_the_path() -> None:
    data = encode_rollup(sample())
    for i in range(0, len(data), 7):
        broken = bytearray(data)
        broken[i] ^= 0x10
        with pytest.raises(CorruptionError) as caught:
            decode_rollup(bytes(broken), path="shards/orders/rollup/x")
        assert caught.value.path == "shards/orders/rollup/x"


def test_rollup_of_an_invalid_state_is_corruption() -> None:
    bad = msgspec.structs.replace(sample(), upper=99)
    with pytest.raises(CorruptionError, match="the trace ends") as caught:
        decode_rollup(encode_rollup(bad), path="p")
    assert caught.value.path == "p"


def test_encoded_sizes_stay_small() -> None:
    """Pins the sizes the RFC promises (§4.2/§4.3): a small append's diff is a few hundred
    bytes, and a rollup grows by about 130 bytes per one-part batch."""
    writer = new_writer_id()
    state = append(with_writer(initial(), writer), 0, 1, [((b"k", b"v"), 0, 1)], writer_id=writer)
    after = append(state, 1, 2, [((b"key-1", b"value-1"), 1, 1)], writer_id=writer)
    diff = StateDiff.between(state, after, nonce=new_token(), prev_digest=1 << 63)
    assert len(encode_state_diff(diff)) <= 450  # with a merge claim the append made

    settings = PersistSettings(compaction="off", max_trace_batches=5000)

    def rollup_size(batches: int) -> int:
        state = with_writer(initial(), writer)
        for t in range(batches):
            part = HollowPart(f"part/{writer}/{new_token()}.sst", 123_456, 1000, b"k%06d" % t, t, t)
            state = append(state, t, t + 1, runs=((part,),), writer_id=writer, settings=settings)
        return len(encode_rollup(state))

    small, large = rollup_size(10), rollup_size(300)
    assert (large - small) / 290 <= 135
    assert small <= 1500
