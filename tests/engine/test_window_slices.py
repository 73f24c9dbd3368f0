"""A merge window one source dominates is merged by slices of it
(:mod:`slatepy.engine.window_slices`): the result must be ``newest_columns``' (highest seq,
an earlier source on a tie, tombstones kept), forwards and backwards, and a scan of a run
under a few small L0 SSTs and a memtable must equal a dict model."""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import slatepy.engine.columns as columns_module
from slatepy import Db, DbReader, Settings
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.engine.window_slices import dominated, newest_by_slices
from slatepy.store import open_store
from slatepy.table.merge import newest_columns

Part = tuple[list[bytes], Any, list[bytes | None]]


def both_ways(parts: list[Part]) -> None:
    """``newest_by_slices`` of ``parts`` (ascending) and of them reversed (descending) equal
    ``newest_columns`` of them."""
    keys, seqs, values = newest_columns(parts)
    expected = list(zip(keys, list(seqs), values, strict=True))
    tagged = list(enumerate(parts))
    got = newest_by_slices(tagged, False)
    assert list(zip(*got, strict=True)) == expected
    descending = [(i, (k[::-1], s[::-1], v[::-1])) for i, (k, s, v) in tagged]
    got = newest_by_slices(descending, True)
    assert list(zip(*got, strict=True)) == expected[::-1]


def part(rows: list[tuple[int, int, bytes | None]], *, packed: bool = False) -> Part:
    """A part of ``(key number, seq, value)`` rows, sorted by key."""
    rows = sorted(rows)
    seqs = [s for _, s, _ in rows]
    return (
        [b"k%04d" % k for k, _, _ in rows],
        array("Q", seqs) if packed else seqs,
        [v for _, _, v in rows],
    )


versions = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 6), st.one_of(st.none(), st.binary(max_size=2))),
    max_size=40,
)


@given(st.lists(versions, min_size=1, max_size=5), st.booleans())
def test_slices_keep_what_newest_columns_keeps(sources: list[list[Any]], packed: bool) -> None:
    """Any parts (not only dominated ones): ties, seqs out of source order, tombstones."""
    parts = []
    for source in sources:
        unique = {k: (k, seq, v) for k, seq, v in source}  # one version per key in a part
        parts.append(part(list(unique.values()), packed=packed))
    both_ways(parts)


def test_equal_keys_across_sources() -> None:
    """The highest seq wins wherever it is; a tie goes to the earlier source; a tombstone
    is a version like any other."""
    run = part([(k, 1, b"run") for k in range(100)])
    newer = part([(5, 9, b"new"), (6, 1, b"tie"), (7, 9, None)])
    older_but_higher = part([(5, 3, b"old"), (8, 12, b"late")])
    both_ways([newer, run, older_but_higher])
    keys, seqs, values = newest_by_slices(list(enumerate([newer, run, older_but_higher])), False)
    got = dict(zip(keys, zip(seqs, values, strict=True), strict=True))
    assert got[b"k0005"] == (9, b"new")
    assert got[b"k0006"] == (1, b"tie")  # the earlier source on a tie on seq
    assert got[b"k0007"] == (9, None)
    assert got[b"k0008"] == (12, b"late")
    assert len(keys) == 100


def test_one_source_exhausted() -> None:
    """A source that ends before (or starts after) the others leaves them as they are."""
    both_ways([part([(k, 2, b"a") for k in range(3)]), part([(k, 1, b"b") for k in range(50)])])
    both_ways(
        [part([(k, 2, b"a") for k in range(45, 50)]), part([(k, 1, b"b") for k in range(40)])]
    )
    both_ways([part([]), part([(k, 1, b"b") for k in range(10)])])


def test_interleaving_by_one_key() -> None:
    """Sources that take turns key by key: a step per key, the same result."""
    both_ways(
        [
            part([(k, 2, b"even") for k in range(0, 60, 2)]),
            part([(k, 1, b"odd") for k in range(1, 60, 2)]),
        ]
    )
    both_ways(
        [
            part([(k, 3, b"a") for k in range(0, 60, 3)]),
            part([(k, 1, b"b") for k in range(0, 60, 2)]),
        ]
    )


def test_tombstones_at_window_edges() -> None:
    """Tombstones first and last in a source, and where a slice of the lead starts or ends."""
    run = part([(0, 1, None), *((k, 1, b"v") for k in range(1, 30)), (30, 1, None)])
    small = part([(0, 5, b"back"), (10, 5, None), (11, 5, None), (30, 5, b"back")])
    both_ways([small, run])
    keys, _, values = newest_by_slices(list(enumerate([small, run])), False)
    assert (keys[0], values[0]) == (b"k0000", b"back")
    assert (keys[-1], values[-1]) == (b"k0030", b"back")
    assert values[10] is None and values[11] is None and values[9] == values[12] == b"v"


def test_other_parts_merged_by_numpy() -> None:
    """Several other parts of 256 rows or more are merged among themselves by numpy when it
    is loaded (their values tagged with their source: tuples in an object array)."""
    pytest.importorskip("numpy")
    run = part([(k, 1, b"run") for k in range(9999)])
    first = part([(k, 5, None if k % 2 else b"a") for k in range(1, 9999, 23)])
    second = part([(k, 5, b"b") for k in range(1, 9999, 29)])  # ties with ``first`` on 1
    parts = [first, run, second]
    assert dominated(list(enumerate(parts)))
    assert len(first[0]) + len(second[0]) >= 256
    both_ways(parts)
    keys, _, values = newest_by_slices(list(enumerate(parts)), False)
    assert values[keys.index(b"k0001")] is None  # ``first``'s, the earlier source on a tie


def test_which_windows_are_dominated() -> None:
    run = part([(k, 1, b"v") for k in range(140)])
    assert dominated([(0, part([(1, 2, b"x")])), (1, run)])
    assert dominated([(0, part([(k, 2, b"x") for k in range(20)])), (1, run)])  # 20 * 8 <= 160
    assert not dominated([(0, part([(k, 2, b"x") for k in range(21)])), (1, run)])
    halves = part([(k, 2, b"x") for k in range(70)])
    assert not dominated([(0, halves), (1, run)])


def test_a_run_under_small_l0_ssts_and_a_memtable_equals_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The layout the slices are for: a few rewrites and deletes over a compacted run, some
    keys in several L0 SSTs; scans forwards, backwards, over ranges and in batches."""
    url = f"file://{tmp_path}/db"
    settings = Settings(compactor="off", block_size=2048)
    model: dict[bytes, bytes] = {}
    with Db.open(url, settings=settings) as db:
        for k in range(4000):
            db.put(b"k%05d" % k, b"run-%d" % k, await_durable=False)
            model[b"k%05d" % k] = b"run-%d" % k
        db.flush()
        Compactor(
            open_store(url), settings=settings, policy=CompactionPolicy(l0_trigger=1)
        ).run_until_idle()
        for flush in range(3):
            for k in [0, 1, 3999, *range(7 + flush, 4000, 97)]:
                key = b"k%05d" % k
                if k % 3 == flush:
                    db.delete(key, await_durable=False)
                    model.pop(key, None)
                else:
                    db.put(key, b"l0-%d" % flush, await_durable=False)
                    model[key] = b"l0-%d" % flush
            db.flush()
            Compactor(
                open_store(url), settings=settings, policy=CompactionPolicy(l0_trigger=1000)
            ).run_until_idle()
        db.refresh()
        assert len(db._view.l0) == 3 and len(db._view.sorted_runs) == 1
    sliced = []
    real = columns_module.newest_by_slices

    def counted(*args: Any) -> Any:
        sliced.append(1)
        return real(*args)

    monkeypatch.setattr(columns_module, "newest_by_slices", counted)
    expected = sorted(model.items())
    with DbReader.open(url, settings=settings) as reader:
        assert list(reader.scan()) == expected
        assert sliced  # the windows went by slices
        assert list(reader.scan(reverse=True)) == expected[::-1]
        inner = [(k, v) for k, v in expected if b"k00500" <= k < b"k03001"]
        assert list(reader.scan(b"k00500", b"k03001")) == inner
        assert list(reader.scan(b"k00500", b"k03001", reverse=True)) == inner[::-1]
        got = [(k, v) for batch in reader.scan_batches(b"", None, batch_size=333) for k, v in batch]
        assert got == expected
    with Db.open(url, settings=settings) as db:  # and a memtable over them
        db.put(b"k00002", b"mem", await_durable=False)
        db.delete(b"k00500", await_durable=False)
        model[b"k00002"] = b"mem"
        model.pop(b"k00500", None)
        assert list(db.scan()) == sorted(model.items())
        assert list(db.scan(reverse=True)) == sorted(model.items())[::-1]
