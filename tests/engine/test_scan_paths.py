"""``Db.scan``'s block-at-a-time path (``scan_merged`` over ``merge_columns``) against the
entry-at-a-time merge it replaced, reverse scans and point gets, over random data in the
memtable, L0 and sorted runs with tombstones, range tombstones, TTLs and merge operands
(RFC 0006, issue 16: a fast path must not diverge from the general one)."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.engine.view import scan_ranges
from slatepy.format.block import Entry
from slatepy.store import open_store
from slatepy.table.layout import compacted_path
from slatepy.table.merge import merge_folding, stamped
from slatepy.table.visibility import folding, live_entries

SETTINGS = Settings(compactor="off", block_size=512, flush_interval=60, gc_min_age=3600)
TO_RUN = CompactionPolicy(l0_trigger=1, target_sst_bytes=2048)
TO_L0 = CompactionPolicy(l0_trigger=1000, target_sst_bytes=2048)
KEYS = 120


def add(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    return b"%d" % (int(existing or b"0") + sum(int(op) for op in operands))


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def key(i: int) -> bytes:
    return b"k%04d" % i


ops = st.one_of(
    st.tuples(st.just("put"), st.integers(0, KEYS - 1), st.integers(0, 999)),
    st.tuples(st.just("put_wide"), st.integers(0, KEYS - 1), st.integers(0, 30)),
    st.tuples(st.just("ttl"), st.integers(0, KEYS - 1), st.integers(1, 20)),
    st.tuples(st.just("delete"), st.integers(0, KEYS - 1), st.just(0)),
    st.tuples(st.just("delete_range"), st.integers(0, KEYS - 1), st.integers(1, 15)),
    st.tuples(st.just("merge"), st.integers(0, KEYS - 1), st.integers(0, 9)),
)


def write(db: Db, phase: list[tuple[str, int, int]]) -> None:
    batch = WriteBatch()
    for op, i, n in phase:
        if op == "put":  # fixed-size values: blocks of these decode in one iter_unpack
            batch.put(key(i), b"%04d" % n)
        elif op == "put_wide":
            batch.put(key(i), b"1" * n)  # digits: a merge (``add``) may land on it
        elif op == "ttl":
            batch.put(key(i), b"%04d" % i, ttl=n)
        elif op == "delete":
            batch.delete(key(i))
        elif op == "delete_range":
            batch.delete_range(key(i), key(i + n))
        else:
            batch.merge(key(i), b"%d" % n)
    if len(batch):
        db.write(batch)


def entry_path(db: Db, start: bytes, end: bytes | None) -> list[tuple[bytes, bytes]]:
    """The scan as it was computed before issue 16: entry streams merged by
    ``merge_folding`` and filtered by ``live_entries``."""
    tables, view = db._tables, db._view

    def run(ssts: tuple) -> Iterator[Entry]:  # type: ignore[type-arg]
        for h in ssts:
            yield from tables.scan(compacted_path(h.id), start, end, size=h.object_size)

    sources: list[Iterator[Entry]] = [iter(db._memtable.range(start, end))]
    sources += [
        stamped(tables.scan(compacted_path(h.id), start, end, size=h.object_size), h.global_seq)
        for h in view.l0
    ]
    sources += [run(r.ssts) for r in view.sorted_runs]
    index = scan_ranges(db._memtable.ranges, view, start, end)
    merged = merge_folding(sources, folding(index, db._merging, complete=True))
    return list(live_entries(merged, index, db._clock, db._merging))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    phases=st.lists(st.lists(ops, max_size=60), min_size=1, max_size=4),
    layout=st.sampled_from(["run", "run+l0", "l0", "memtable"]),
    advance=st.integers(0, 25),
    bounds=st.tuples(st.integers(0, KEYS), st.integers(0, KEYS + 5)),
)
def test_block_path_equals_entry_path_and_gets(
    phases: list[list[tuple[str, int, int]]], layout: str, advance: int, bounds: tuple[int, int]
) -> None:
    clock = Clock()
    store = open_store("memory://")
    with Db.open(store, settings=SETTINGS, clock=clock, merge_operator=add) as db:
        for i, phase in enumerate(phases):
            write(db, phase)
            policy = {"run": TO_RUN, "run+l0": TO_RUN if i == 0 else TO_L0, "l0": TO_L0}.get(layout)
            if policy is not None and i < len(phases) - (layout != "run"):
                compactor = Compactor(store, settings=SETTINGS, policy=policy, merge_operator=add)
                compactor.run_until_idle()
                db.refresh()
        clock.now += advance
        everything = list(db.scan())
        assert everything == entry_path(db, b"", None)
        assert everything == list(db.scan(reverse=True))[::-1]
        gets = [(key(i), db.get(key(i))) for i in range(KEYS + 20)]
        assert everything == [(k, v) for k, v in gets if v is not None]
        lo, hi = key(min(bounds)), key(max(bounds))
        ranged = list(db.scan(lo, hi))
        assert ranged == entry_path(db, lo, hi)
        assert ranged == [(k, v) for k, v in everything if lo <= k < hi]
