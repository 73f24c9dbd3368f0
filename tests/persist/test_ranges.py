"""A snapshot split by key range (``persist.ranges``, ``ReadHandle.snapshot_iter(keys=...)``):
the ranges' reads together are exactly the consolidated snapshot, and each reads only the
blob parts that may hold its keys (RFC 0025, Addendum A)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from slatepy.persist import PersistClient, PersistSettings
from slatepy.persist.codec import encode_key
from slatepy.persist.ranges import in_range, part_key, prune, ranges, split_keys
from slatepy.persist.state.records import HollowPart, InlinePart

SHARD = "s"
SETTINGS = PersistSettings(
    inline_part_max_bytes=0,
    part_target_bytes=1024,
    batch_lease=10.0,
    consensus_min_age=1.0,
    allow_short_leases=True,
)
LONG = b"p" * 70  # a shared prefix longer than a part's key bound: its truncation is exercised


def keys_of(n: int) -> list[bytes]:
    return [k for i in range(n) for k in (b"k%04d" % i, LONG + b"%04d" % i, b"\0z%04d" % i)]


def test_the_ranges_of_a_split_snapshot_read_back_exactly_the_snapshot() -> None:
    rng = random.Random(7)
    keys = keys_of(60)
    with PersistClient.open("memory://", settings=SETTINGS) as client:
        write = client.open_writer(SHARD)
        live: set[tuple[bytes, int]] = set()
        for lower in range(4):  # inserts, then retractions and re-inserts in later batches
            updates = []
            for key in rng.sample(keys, 90):
                value = rng.randrange(2)
                if (key, value) in live:
                    live.discard((key, value))
                    updates.append(((key, b"%d" % value), lower, -1))
                else:
                    live.add((key, value))
                    updates.append(((key, b"%d" % value), lower, 1))
            write.compare_and_append(updates, lower, lower + 1)
        read = client.open_leased_reader(SHARD)
        whole = read.snapshot(3)
        assert sorted((k, int(v)) for (k, v), _, d in whole for _ in range(d)) == sorted(live)
        runs = [run for batch in client.machine(SHARD).fetch().trace for run in batch.runs]
        cuts = split_keys(runs, 4)
        assert len(cuts) == 3 and cuts == sorted(set(cuts))
        pieces = [list(read.snapshot_iter(3, keys=r)) for r in ranges(cuts)]
        assert [u for piece in pieces for u in piece] == whole
        assert sum(map(bool, pieces)) >= 3  # a range may be empty (its keys retracted)
        total = sum(len(run) for run in runs)
        for lower, upper in ranges(cuts):
            assert sum(len(prune(run, lower, upper)) for run in runs) < total


def hollow(first_key: bytes) -> HollowPart:
    return HollowPart("p", 1, 1, first_key[:64], 0, 0)


def test_prune_keeps_every_part_that_may_hold_a_key_of_the_range() -> None:
    a, b, c = (hollow(encode_key(k, b"v", 0)) for k in (b"a", b"b", b"c"))
    inline = InlinePart(b"", 0)
    run = (a, inline, b, c)
    assert prune(run, None, None) == run
    assert prune(run, b"b", b"c") == (a, inline, b)  # a may hold (b, "u"); c is above
    assert prune(run, b"ba", b"c") == (inline, b)  # a ends below (b, "v"), so below "ba"
    assert prune(run, b"ab", b"b") == (a, inline)  # "ab" may lie in a; upper is exclusive
    assert prune(run, b"c", None) == (inline, b, c)
    assert prune(run, b"ca", None) == (inline, c)
    # Truncated bounds: a part before one whose first key starts with LONG may hold LONG + x.
    x, y = hollow(encode_key(LONG + b"1", b"v", 0)), hollow(encode_key(LONG + b"5", b"v", 0))
    assert prune((x, y), LONG + b"6", None) == (x, y)
    assert prune((x, y), b"q", None) == (y,)


def test_split_keys_and_part_key() -> None:
    assert part_key(encode_key(b"a\0b", b"v", 3)) == b"a\0b"
    assert part_key(encode_key(LONG, b"v", 3)[:64]) is None  # cut by the truncation
    runs = [tuple(hollow(encode_key(b"%02d" % i, b"v", 0)) for i in range(10))]
    assert split_keys(runs, 1) == [] and split_keys(runs[:0], 4) == []
    assert split_keys(runs, 2) == [b"05"]
    assert split_keys(runs, 100) == [b"%02d" % i for i in range(1, 10)]
    assert ranges([b"05"]) == [(None, b"05"), (b"05", None)]
    updates = [((k, b""), 0, 1) for k in (b"04", b"05", b"06")]
    assert list(in_range(iter(updates), b"05", b"06")) == [updates[1]]


FIELD = st.lists(st.sampled_from([0, 1, 97]), max_size=3).map(bytes)  # few keys, with NULs
KEY = st.one_of(FIELD, FIELD.map(lambda b: LONG + b))
VALUE = st.integers(0, 99).map(lambda i: b"%02d" % i)  # many values per key: keys span parts


@settings(max_examples=40, deadline=None)
@given(
    updates=st.lists(st.tuples(KEY, VALUE, st.integers(-2, 2)), min_size=1, max_size=300),
    data=st.data(),
)
def test_any_cuts_read_back_exactly_the_snapshot(
    updates: list[tuple[bytes, bytes, int]], data: st.DataObject
) -> None:
    """Arbitrary cuts (near the stored keys, not only part keys), keys with NULs and past the
    truncated bound."""
    near = st.sampled_from([k for k, _, _ in updates]).flatmap(
        lambda k: st.sampled_from([k, k + b"\0", k[:-1], k + b"\xff"])
    )
    cuts = data.draw(st.lists(st.one_of(near, KEY), max_size=4))
    with PersistClient.open("memory://", settings=SETTINGS) as client:
        write = client.open_writer(SHARD)
        half = len(updates) // 2
        for t, chunk in enumerate((updates[:half], updates[half:])):
            write.compare_and_append([((k, v), t, d) for k, v, d in chunk if d], t, t + 1)
        read = client.open_leased_reader(SHARD)
        whole = read.snapshot(1)
        pieces = [list(read.snapshot_iter(1, keys=r)) for r in ranges(sorted(set(cuts)))]
        assert [u for piece in pieces for u in piece] == whole
