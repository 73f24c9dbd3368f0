"""Damaged bytes are typed errors, never wrong data (RFC 0015 §11, §13.4).

A byte flipped anywhere in a hollow part, in an inline part (as it travels: in a consensus
diff entry, or in a shipped batch), in a consensus diff entry, in a rollup or in a shipped
batch's bytes raises ``CorruptionError`` whose ``path`` names the damaged object (where there
is one), and nothing is committed. ``batch_from_bytes`` fed random bytes, mutated batches and
well-sealed envelopes around arbitrary msgpack raises only ``UsageError`` or
``CorruptionError``.
"""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

from slatepy.errors import CorruptionError
from slatepy.format.envelope import seal
from slatepy.persist import PersistClient, PersistSettings, UsageError, WriteHandle
from slatepy.persist.compactor import compact
from slatepy.persist.state.records import HollowPart, InlinePart
from slatepy.persist.versions import entry_path, shard_path
from slatepy.persist.write import BATCH_FORMAT_VERSION, BATCH_MAGIC
from slatepy.store import open_store
from slatepy.store.base import ObjectStore
from tests.persist.compaction_kit import claims, manual
from tests.persist.handles_kit import SHARD, nothing_committed, state_of

SETTINGS = PersistSettings(
    batch_lease=10.0,
    consensus_min_age=1.0,
    allow_short_leases=True,
    inline_part_max_bytes=64,  # one small update inline, more in a blob
    rollup_min_bytes=0,
    rollup_min_diffs=1,
)
NO_ROLLUPS = PersistSettings(
    batch_lease=10.0,
    consensus_min_age=1.0,
    allow_short_leases=True,
    rollup_min_diffs=1000,  # every cold load replays the log from seqno 1
)
ROW = ((b"k", b"v"), 0, 1)
BIG = [((b"k%03d" % i, b"x" * 20), 1, 1) for i in range(8)]


@pytest.fixture(name="raw")
def raw_fixture() -> ObjectStore:
    """A memory store that every client of a test shares (``memory://`` URLs do not)."""
    return open_store("memory://")


@pytest.fixture(name="client")
def client_fixture(raw: ObjectStore) -> Iterator[PersistClient]:
    # No background merges: they would commit (and roll up) while a test damages objects.
    with manual(PersistClient.open(raw, settings=SETTINGS)) as opened:
        yield opened


def flipped(data: bytes, index: int) -> bytes:
    damaged = bytearray(data)
    damaged[index] ^= 0x40
    return bytes(damaged)


def spread(size: int, count: int = 48) -> list[int]:
    """Up to ``count`` offsets over ``[0, size)``: every byte of small objects, else both
    ends and an even spread (headers, first block, index, footer, checksum)."""
    if size <= count:
        return list(range(size))
    ends = [*range(8), *range(size - 8, size)]
    step = size / (count - len(ends))
    return sorted({*ends, *(int(i * step) for i in range(count - len(ends)))})


def test_a_flipped_byte_in_a_hollow_part_is_corruption_naming_it(
    raw: ObjectStore, client: PersistClient
) -> None:
    write = client.open_writer(SHARD)
    write.compare_and_append(BIG, 0, 2)
    write.compare_and_append([((b"z", b"x" * 20), 2, 1)] * 8, 2, 3)  # a second run: a merge
    (part,) = list(state_of(client).trace[0].parts())
    assert isinstance(part, HollowPart)
    path = shard_path(SHARD, part.key)
    good = raw.get(path)
    read = client.open_leased_reader(SHARD)
    requests = claims(state_of(client), write.writer_id)
    for index in spread(len(good)):
        raw.put(path, flipped(good, index))
        with nothing_committed(client), pytest.raises(CorruptionError) as info:
            read.snapshot(1)
        assert info.value.path == path, index
        for request in requests:  # a merge reading it: nothing applied, no output left
            with nothing_committed(client), pytest.raises(CorruptionError) as info:
                compact(client.machine(SHARD), client._tables, write.writer_id, request)
            assert info.value.path == path, index
    raw.put(path, good)
    assert read.snapshot(1) == sorted(((k, v), 1, 1) for (k, v), _, _ in BIG)


def test_a_flipped_byte_in_a_consensus_entry_is_corruption_naming_it(
    raw: ObjectStore,
) -> None:
    with PersistClient.open(raw, settings=NO_ROLLUPS) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([ROW], 0, 1)  # seqno 1: registers, appends an inline part
        assert isinstance(next(iter(state_of(client).trace[0].parts())), InlinePart)
    path = entry_path(SHARD, 1)
    good = raw.get(path)
    for index in spread(len(good), count=len(good)):  # every byte, the inline part's too
        raw.put(path, flipped(good, index))
        with PersistClient.open(raw, settings=NO_ROLLUPS) as cold:
            with pytest.raises(CorruptionError) as info:
                cold.open_writer(SHARD)  # loads the state: replays the entry
            assert info.value.path == path, index
            with nothing_committed(cold), pytest.raises(CorruptionError):
                cold.open_leased_reader(SHARD)  # registering needs the state first
    raw.put(path, good)
    with PersistClient.open(raw, settings=NO_ROLLUPS) as cold:
        assert cold.open_leased_reader(SHARD).snapshot(0) == [ROW]


def test_a_flipped_byte_in_a_rollup_is_corruption_naming_it(
    raw: ObjectStore, client: PersistClient
) -> None:
    write = client.open_writer(SHARD)
    for t in range(4):
        write.compare_and_append([((b"k", b"v"), t, 1)], t, t + 1)
    rollups = state_of(client).rollups
    assert rollups
    path = shard_path(SHARD, rollups[max(rollups)].key)
    good = raw.get(path)
    for index in spread(len(good)):
        raw.put(path, flipped(good, index))
        with PersistClient.open(raw, settings=SETTINGS) as cold:
            with nothing_committed(cold), pytest.raises(CorruptionError) as info:
                cold.open_leased_reader(SHARD)  # a cold load starts at the latest rollup
            assert info.value.path == path, index
    raw.put(path, good)
    with PersistClient.open(raw, settings=SETTINGS) as cold:
        assert cold.open_leased_reader(SHARD).snapshot(3) == [((b"k", b"v"), 3, 4)]


@pytest.mark.parametrize("kind", ["inline", "hollow"])
def test_a_flipped_byte_in_a_shipped_batch_is_corruption(client: PersistClient, kind: str) -> None:
    write = client.open_writer(SHARD)
    batch = write.batch([ROW] if kind == "inline" else [*BIG[:1], ROW], 0, 2)
    assert {type(p) for r in batch.record.runs for p in r} == {
        InlinePart if kind == "inline" else HollowPart
    }
    data = batch.to_bytes()
    receiver = client.open_writer(SHARD)
    for index in range(len(data)):  # the inline part's bytes and the part keys too
        with nothing_committed(client), pytest.raises(CorruptionError):
            receiver.batch_from_bytes(flipped(data, index))
    receiver.compare_and_append_batch([receiver.batch_from_bytes(data)], 0, 2)


def _shipper(client: PersistClient) -> tuple[WriteHandle, bytes]:
    write = client.open_writer(SHARD)
    return write, write.batch(BIG[:3], 0, 2).to_bytes()


FUZZ = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

MSGPACK = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.binary(max_size=40)
    | st.text(max_size=40)
    | st.sampled_from([SHARD, "part/w1/" + "a" * 32 + ".sst", "h", "i"]),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=25,
)
FIELDS = st.fixed_dictionaries(
    {
        "shard_id": st.sampled_from([SHARD, "other", ""]) | MSGPACK,
        "writer_id": st.text(max_size=10) | MSGPACK,
        "lower": st.integers(-2, 2**64 - 1) | MSGPACK,
        "upper": st.none() | st.integers(-2, 2**64 - 1) | MSGPACK,
        "runs": st.lists(st.lists(MSGPACK, max_size=3), max_size=3) | MSGPACK,
        "written_ms": st.integers(-(2**63), 2**64 - 1) | MSGPACK,
    }
)


def _only_typed_errors(write: WriteHandle, data: bytes) -> None:
    try:
        batch = write.batch_from_bytes(data)
    except (UsageError, CorruptionError):
        return
    assert batch.shard_id == SHARD


def test_fuzzed_batch_bytes_raise_only_usage_or_corruption_errors(client: PersistClient) -> None:
    write, good = _shipper(client)

    @FUZZ
    @given(
        payload=st.one_of(
            st.binary(max_size=300),
            st.builds(
                lambda edits, d=good: _mutated(d, edits),
                st.lists(st.tuples(st.integers(0, len(good)), st.integers(0, 255)), max_size=4),
            ),
            MSGPACK.map(
                lambda v: seal(BATCH_MAGIC, BATCH_FORMAT_VERSION, msgspec.msgpack.encode(v))
            ),
            FIELDS.map(
                lambda v: seal(BATCH_MAGIC, BATCH_FORMAT_VERSION, msgspec.msgpack.encode(v))
            ),
        )
    )
    def check(payload: bytes) -> None:
        _only_typed_errors(write, payload)

    with nothing_committed(client):
        check()


def _mutated(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    """``data`` with bytes replaced, inserted (odd values) or cut off (at the end)."""
    out = bytearray(data)
    for offset, value in edits:
        at = min(offset, len(out))
        if value % 3 == 0:
            del out[at:]
        elif value % 3 == 1 and at < len(out):
            out[at] = value
        else:
            out.insert(at, value)
    return bytes(out)


def test_batch_from_bytes_refuses_what_is_not_bytes(client: PersistClient) -> None:
    write, _ = _shipper(client)
    for bad in ("text", None, ["a"], 1.5, 7):  # bytes(7) would be seven zero bytes
        with nothing_committed(client), pytest.raises(UsageError):
            write.batch_from_bytes(bad)  # type: ignore[arg-type]
