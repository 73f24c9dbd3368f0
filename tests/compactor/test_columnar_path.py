"""Compaction's columnar path writes the very SSTs the entry path writes.

``compact_plan(columnar=True)`` merges windows of plain values in C and writes them with
``SstBuilder.extend_below``; every other window, and every compaction with range
tombstones, takes the entry path (``merge_folding``, ``compacted_entries``, one
``SstBuilder.add`` per entry). These tests build inputs directly (WAL SSTs, L0 SSTs with and
without a global seq, sorted runs of several SSTs), run both paths over the same store, and
compare the outputs byte for byte: entries, cut points, handles.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slatepy.compactor import columnar_merge
from slatepy.compactor.executor import compact_plan
from slatepy.compactor.outputs import handle_of
from slatepy.compactor.planner import CompactionPolicy, L0ToRun, Plan, WalToL0
from slatepy.format import sst_bulk
from slatepy.format.block import Entry
from slatepy.format.columnar import ENTRY_OVERHEAD as COLUMN_ENTRY_OVERHEAD
from slatepy.format.compression import Compression
from slatepy.format.kinds import Expiring, Operands, RangeTombstone
from slatepy.format.sst import SstBuilder
from slatepy.manifest.record import Manifest, SortedRun, SstHandle
from slatepy.store import ObjectStore, open_store
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX, compacted_path
from slatepy.table.merge_operator import Merging
from slatepy.table.reader import Piece, TableReader

NOW = 1_000.0
"""The tests' wall clock (seconds): Expiring values below expire at 500 s or 2,000 s."""


def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    return b",".join([existing, *operands] if existing is not None else operands)


MERGING = Merging(concat, clock=lambda: NOW)

Value = bytes | None
Source = dict[bytes, tuple[int, Value]]
"""One input's entries: key -> (seq, value)."""

plain_values = st.binary(max_size=24)
any_values = st.one_of(
    plain_values,
    plain_values,
    st.none(),
    st.builds(Expiring.make, plain_values, st.sampled_from([500_000, 2_000_000])),
    st.builds(Operands.of, st.lists(st.binary(max_size=6), min_size=1, max_size=3)),
)


@st.composite
def sources(draw: st.DrawFn, *, count: int, disjoint: bool) -> list[Source]:
    """``count`` inputs over a small key space (so keys repeat, with seqs that tie), each
    either plain values only or any kind; with ``disjoint`` each in its own key range."""
    out: list[Source] = []
    for j in range(count):
        values = plain_values if draw(st.booleans()) else any_values
        lo, hi = (j * 40, j * 40 + 39) if disjoint else (0, 59)
        keys = st.integers(lo, hi).map(lambda i: b"k%03d" % i)
        out.append(
            draw(
                st.dictionaries(keys, st.tuples(st.integers(1, 12), values), max_size=40),
            )
        )
    return out


def build(entries: list[tuple[bytes, int, Value]], block_size: int, *, wal: bool) -> SstBuilder:
    builder = SstBuilder(
        writer_epoch=1 if wal else 0, block_size=block_size, bloom_bits_per_key=0 if wal else 10
    )
    for key, seq, value in entries:
        builder.add(key, seq, value)
    return builder


def ordered(source: Source, *, stored_seq: int | None = None) -> list[tuple[bytes, int, Value]]:
    return [
        (key, seq if stored_seq is None else stored_seq, value)
        for key, (seq, value) in sorted(source.items())
    ]


def put_wal(
    store: ObjectStore, srcs: list[Source], block_size: int, tombstone: RangeTombstone | None
) -> Plan:
    """The inputs as WAL SSTs 1..n (the first source in the newest one, as plans order
    them); the newest holds ``tombstone`` if given."""
    wal = NumberedObjects(store, WAL_DIR, WAL_SUFFIX)
    for j, source in enumerate(srcs):
        builder = build(ordered(source), block_size, wal=True)
        if tombstone is not None and j == 0:
            builder.add_range_tombstone(tombstone)
        store.put(wal.path(len(srcs) - j), bytes(builder.finish().data))
    return WalToL0(1, len(srcs))


def put_compacted(
    store: ObjectStore, entries: list[tuple[bytes, int, Value]], block_size: int
) -> SstHandle:
    encoded = build(entries, block_size, wal=False).finish()
    handle = handle_of(f"in{len(store.list('compacted/'))}", encoded)
    store.put(compacted_path(handle.id), bytes(encoded.data))
    return handle


@dataclass
class Inputs:
    plan: Plan
    manifest: Manifest


def put_levels(
    store: ObjectStore,
    srcs: list[Source],
    block_size: int,
    *,
    ingested: list[bool],
    run_ssts: int,
    drop: bool,
) -> Inputs:
    """The first sources as L0 SSTs (an ingested one stores seq 0 and takes its handle's
    global seq: the seq of its first entry), the last as a sorted run of ``run_ssts``
    SSTs."""
    l0: list[SstHandle] = []
    for source, ingest in zip(srcs[:-1], ingested, strict=False):
        if ingest and source:
            global_seq = min(seq for seq, _ in source.values())
            handle = put_compacted(store, ordered(source, stored_seq=0), block_size)
            l0.append(msgspec.structs.replace(handle, global_seq=global_seq))
        elif source:
            l0.append(put_compacted(store, ordered(source), block_size))
    run_entries = ordered(srcs[-1])
    step = max(1, -(-len(run_entries) // run_ssts))
    run = [
        put_compacted(store, run_entries[i : i + step], block_size)
        for i in range(0, len(run_entries), step)
    ]
    manifest = Manifest(l0=tuple(l0), sorted_runs=(SortedRun(1, tuple(run)),) if run else ())
    plan = L0ToRun(tuple(h.id for h in l0), (1,) if run else (), 2, drop)
    return Inputs(plan, manifest)


def outputs(
    store: ObjectStore,
    inputs: Inputs,
    *,
    columnar: bool,
    target: int,
    block_size: int,
    compression: Compression,
) -> list[tuple[SstHandle, bytes]]:
    """The handles (ids blanked: fresh random ones) and bytes of the plan's outputs."""
    tables = TableReader(store)
    handles = compact_plan(
        inputs.plan,
        inputs.manifest,
        tables,
        CompactionPolicy(target_sst_bytes=target),
        block_size=block_size,
        bloom_bits_per_key=10,
        compression=compression,
        clock=lambda: NOW,
        merging=MERGING,
        columnar=columnar,
    )
    return [(msgspec.structs.replace(h, id=""), store.get(compacted_path(h.id))) for h in handles]


def assert_same_outputs(
    store: ObjectStore, inputs: Inputs, *, target: int, block_size: int, compression: Compression
) -> list[tuple[SstHandle, bytes]]:
    kwargs = {"target": target, "block_size": block_size, "compression": compression}
    expected = outputs(store, inputs, columnar=False, **kwargs)  # type: ignore[arg-type]
    got = outputs(store, inputs, columnar=True, **kwargs)  # type: ignore[arg-type]
    assert [h for h, _ in got] == [h for h, _ in expected]
    assert [data for _, data in got] == [data for _, data in expected]
    return got


layouts = st.tuples(st.integers(1, 5), st.booleans()).flatmap(
    lambda c: st.tuples(st.just(c[0]), sources(count=c[0], disjoint=c[1]))
)
targets = st.sampled_from([1, 60, 150, 400, 1500, 1 << 30])
block_sizes = st.sampled_from([48, 100, 300, 4096])
compressions = st.sampled_from(["none", "none", "zstd", "lz4"])
batch_rows = st.sampled_from([1, 3, 10, 512])


@settings(max_examples=150, deadline=None)
@given(
    layout=layouts,
    target=targets,
    block_size=block_sizes,
    compression=compressions,
    rows=batch_rows,
    tombstone=st.booleans(),
)
def test_wal_compaction_writes_the_same_ssts_either_way(
    *,
    layout: tuple[int, list[Source]],
    target: int,
    block_size: int,
    compression: Compression,
    rows: int,
    tombstone: bool,
) -> None:
    _, srcs = layout
    store = open_store("memory://")
    plan = put_wal(
        store, srcs, block_size, RangeTombstone(b"k010", b"k030", 7) if tombstone else None
    )
    with patched_rows(rows):
        assert_same_outputs(
            store,
            Inputs(plan, Manifest()),
            target=target,
            block_size=block_size,
            compression=compression,
        )


@settings(max_examples=150, deadline=None)
@given(
    layout=layouts,
    ingested=st.lists(st.booleans(), min_size=4, max_size=4),
    run_ssts=st.integers(1, 4),
    drop=st.booleans(),
    target=targets,
    block_size=block_sizes,
    compression=compressions,
    rows=batch_rows,
)
def test_level_compaction_writes_the_same_ssts_either_way(
    *,
    layout: tuple[int, list[Source]],
    ingested: list[bool],
    run_ssts: int,
    drop: bool,
    target: int,
    block_size: int,
    compression: Compression,
    rows: int,
) -> None:
    _, srcs = layout
    store = open_store("memory://")
    inputs = put_levels(store, srcs, block_size, ingested=ingested, run_ssts=run_ssts, drop=drop)
    with patched_rows(rows):
        assert_same_outputs(
            store, inputs, target=target, block_size=block_size, compression=compression
        )


class patched_rows:
    """The columnar path's batch, group and window sizes set to ``rows`` for a block
    (hypothesis runs many examples in one test call, so a function-scoped monkeypatch would
    not undo each): small ones cut the inputs' groups, windows and batches mid-source."""

    NAMES = ("PLAIN_BATCH_ROWS", "SOURCE_GROUP_ROWS", "MAX_WINDOW_ROWS")

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __enter__(self) -> None:
        self.saved = [getattr(columnar_merge, name) for name in self.NAMES]
        for name in self.NAMES:
            setattr(columnar_merge, name, self.rows)

    def __exit__(self, *exc: object) -> None:
        for name, value in zip(self.NAMES, self.saved, strict=True):
            setattr(columnar_merge, name, value)


def counted_adds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that counts the ``SstBuilder.add`` calls from now on (one element per call)."""
    calls: list[int] = []
    add = SstBuilder.add

    def counting(self: SstBuilder, key: bytes, seq: int, value: bytes | None) -> None:
        calls.append(1)
        add(self, key, seq, value)

    monkeypatch.setattr(SstBuilder, "add", counting)
    return calls


def both_paths(
    monkeypatch: pytest.MonkeyPatch, store: ObjectStore, plan: Plan, target: int
) -> tuple[list[tuple[SstHandle, bytes]], list[tuple[SstHandle, bytes]], list[int]]:
    """The outputs of the columnar path, of the entry path, and the ``SstBuilder.add``
    calls the columnar one made (512-byte blocks, no compression)."""
    run = partial(
        outputs, store, Inputs(plan, Manifest()), target=target, block_size=512, compression="none"
    )
    expected = run(columnar=False)
    calls = counted_adds(monkeypatch)
    got = run(columnar=True)
    return got, expected, calls


def overlapping_plain(count: int, keys: int) -> list[Source]:
    """``count`` inputs over the same keys, every key in each (newer inputs' seqs higher,
    but ties on seq too: key ``i`` has seq ``i % 3`` in every input)."""
    return [
        {b"k%05d" % i: (1 + (i % 3 if i % 2 else j), b"v%d-%d" % (j, i)) for i in range(keys)}
        for j in range(count)
    ]


def test_plain_inputs_take_the_columnar_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Overlapping plain inputs (repeated keys, ties on seq): no entry is added one by one,
    and the outputs are the entry path's."""
    store = open_store("memory://")
    plan = put_wal(store, overlapping_plain(3, 3000), 512, tombstone=None)
    got, expected, calls = both_paths(monkeypatch, store, plan, 8000)
    assert calls == []
    assert got == expected
    assert len(got) > 5 and sum(h.entry_count for h, _ in got) == 3000


def test_a_window_of_other_kinds_takes_the_entry_path_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One tombstone among thousands of plain values: only its window is added entry by
    entry, and the outputs are the entry path's."""
    srcs = overlapping_plain(2, 5000)
    srcs[0][b"k02500"] = (9, None)
    store = open_store("memory://")
    plan = put_wal(store, srcs, 512, tombstone=None)
    got, expected, calls = both_paths(monkeypatch, store, plan, 20_000)
    assert got == expected
    assert 0 < len(calls) < 2500


def test_range_tombstones_take_the_entry_path(monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store("memory://")
    plan = put_wal(
        store, overlapping_plain(2, 500), 512, tombstone=RangeTombstone(b"k00010", b"k00030", 7)
    )
    calls = counted_adds(monkeypatch)
    outputs(
        store,
        Inputs(plan, Manifest()),
        columnar=True,
        target=8000,
        block_size=512,
        compression="none",
    )
    assert len(calls) == 500 - 20  # k00010..k00029 are under the range tombstone


def builder(compression: str, version: int) -> SstBuilder:
    return SstBuilder(
        writer_epoch=0,
        block_size=256,
        compression=compression,  # type: ignore[arg-type]
        format_version=version,
    )


def estimates(entries: list[tuple[bytes, int, bytes]], compression: str, version: int) -> list[int]:
    """The estimated size of an SST builder before each of ``entries`` is added."""
    one = builder(compression, version)
    sizes = []
    for entry in entries:
        sizes.append(one.estimated_size)
        one.add(*entry)
    return sizes


def _rows(kind: str) -> list[Entry]:
    """600 entries whose keys and values vary in length, have one length each (the bulk
    adds' shortcut), or vary while their lengths sum to the count times the first's."""
    if kind == "varying":
        return [(b"key%05d" % i, i + 1, b"v" * (i % 37)) for i in range(600)]

    def extra(i: int) -> int:
        return 0 if kind == "fixed" or i in (0, 599) else (-1 if i % 2 else 1)

    return [
        (b"key%05d" % i + b"x" * (1 + extra(i)), i + 1, b"v" * (20 + extra(i))) for i in range(600)
    ]


@pytest.mark.parametrize(
    ("version", "rows"),
    [(6, "varying"), (5, "varying"), (3, "varying"), (6, "fixed"), (6, "alike_in_sum")],
)
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_extend_below_stops_where_a_loop_of_add_would(
    compression: str, version: int, rows: str
) -> None:
    """``extend_below`` adds what ``add`` one by one would before the estimated size reaches
    the limit (the first entry always), and the SSTs are byte-identical: limits at, just
    below and just above the sizes the loop sees, inside blocks and right after one closed,
    into an empty builder and into one whose open block holds entries added one by one; rows
    of varying sizes, of one size, and of sizes that differ but sum as if they were one."""
    entries = _rows(rows)
    keys, seqs, values = (list(column) for column in zip(*entries, strict=True))
    seen = estimates(entries, compression, version)
    every = 7 if rows == "varying" else 29  # the others: as many block cuts, fewer limits
    limits = {1, 1 << 30} | {s + d for s in seen[::every] for d in (-1, 0, 1)}
    for limit in sorted(limits):
        for begin, added in ((0, 0), (17, 0), (17, 17)):
            one, bulk = builder(compression, version), builder(compression, version)
            for entry in entries[:added]:
                one.add(*entry)
                bulk.add(*entry)
            stop = begin
            for i in range(begin, len(entries)):
                if i > begin and one.estimated_size >= limit:
                    break
                one.add(*entries[i])
                stop = i + 1
            assert bulk.extend_below(keys, seqs, values, begin, limit) == stop, limit
            assert bulk.estimated_size == one.estimated_size
            assert bytes(bulk.finish().data) == bytes(one.finish().data)


def test_input_groups_are_bounded_in_rows_and_bytes() -> None:
    """A source's blocks are merged ``SOURCE_GROUP_ROWS`` rows or a read chunk's bytes at a
    time, whichever comes first: large values do not make a group of thousands of them."""
    blocks: list[Piece] = [
        ([b"k%05d" % (i * 10 + j) for j in range(10)], [1] * 10, [b"v"] * 10, True)
        for i in range(500)
    ]
    groups = list(columnar_merge.groups(iter(blocks), 1 << 30))
    assert [len(g[0]) for g in groups] == [2050, 2050, 900]
    big: list[Piece] = [([b"k%05d" % i], [1], [b"x" * 10_000], i != 3) for i in range(50)]
    groups = list(columnar_merge.groups(iter(big), 64 * 1024))
    assert [len(g[0]) for g in groups] == [7, 7, 7, 7, 7, 7, 7, 1]
    assert [g[3] for g in groups] == [False] + [True] * 7


def test_rows_of_one_size_take_the_bulk_adds_shortcut() -> None:
    """Block cuts of fixed-size rows come from a ``range`` (no length summed per row); rows
    whose lengths vary, even summing as if they did not, from the lengths themselves."""
    for kind, shortcut in (("fixed", True), ("alike_in_sum", False), ("varying", False)):
        keys, _, values = (list(column) for column in zip(*_rows(kind), strict=True))
        ends = sst_bulk._column_ends(keys, values, 0)
        assert isinstance(ends, range) == shortcut, kind
        sizes = [len(k) + len(v) + COLUMN_ENTRY_OVERHEAD for k, v in zip(keys, values, strict=True)]
        assert list(ends) == [sum(sizes[:r]) for r in range(len(sizes) + 1)], kind
        assert list(sst_bulk._column_ends(keys, values, 17)) == [
            sum(sizes[17 : 17 + r]) for r in range(len(sizes) - 16)
        ], kind
