"""The one-``iter_unpack`` decode of uniform blocks (issue 16) gives exactly what the
entry-by-entry walk gives, and still reports a damaged block."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slatepy.errors import CorruptionError
from slatepy.format.block import BlockBuilder, _frame, _parse_entries, _parse_uniform, decode_block
from slatepy.format.checksum import append_checksum
from slatepy.format.kinds import Expiring, Operands

values = st.one_of(
    st.just(b"v" * 8),
    st.binary(min_size=8, max_size=8),
    st.binary(max_size=12),
    st.none(),
    st.builds(lambda v: Expiring.make(v, 99), st.binary(min_size=4, max_size=4)),
    st.builds(lambda v: Operands.of([v]), st.binary(min_size=2, max_size=2)),
)


@given(
    rows=st.dictionaries(st.binary(min_size=3, max_size=4), values, min_size=1, max_size=40),
    indexed=st.booleans(),
)
def test_uniform_decode_equals_the_entry_walk(
    rows: dict[bytes, bytes | None], indexed: bool
) -> None:
    builder = BlockBuilder(indexed=indexed)
    for seq, k in enumerate(sorted(rows)):
        builder.add(k, seq, rows[k])
    raw, count, entries_end = _frame(builder.finish(), indexed)
    walked = _parse_entries(raw, count, entries_end, indexed=indexed)
    fast = _parse_uniform(raw, count, entries_end, indexed)
    if fast is not None:
        assert (fast.keys, fast.seqs, fast.values, fast.payload) == (
            walked.keys,
            walked.seqs,
            walked.values,
            walked.payload,
        )
        assert all(type(v) is bytes for v in fast.values)
    assert decode_block(bytes(raw), indexed=indexed) == walked


def test_a_uniform_block_with_a_bad_offsets_array_is_corrupt() -> None:
    builder = BlockBuilder()
    for i in range(5):
        builder.add(b"k%d" % i, i, b"value")
    raw, count, entries_end = _frame(builder.finish(), True)
    assert _parse_uniform(raw, count, entries_end, True) is not None
    body = bytearray(raw[:-8])
    body[entries_end + 4 * (count - 1)] ^= 1  # the last entry's offset
    with pytest.raises(CorruptionError, match="offsets array"):
        decode_block(append_checksum(bytes(body)))


def test_a_uniform_looking_block_with_one_odd_header_is_walked() -> None:
    builder = BlockBuilder(indexed=False)
    builder.add(b"a1", 1, b"xy")
    builder.add(b"a2", 2, b"xyz")  # one byte longer ...
    builder.add(b"a", 3, b"xyz")  # ... and one key shorter: the same total size
    raw, count, entries_end = _frame(builder.finish(), False)
    assert _parse_uniform(raw, count, entries_end, False) is None
    assert decode_block(raw, indexed=False).keys == [b"a1", b"a2", b"a"]
