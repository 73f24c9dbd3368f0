"""The pure planner and result transition (and one end-to-end ordering case)."""

from __future__ import annotations

import msgspec
import pytest

from slatepy import Db, Settings
from slatepy.compactor import (
    CompactionPolicy,
    Compactor,
    L0ToRun,
    WalToL0,
    apply_result,
    plan,
)
from slatepy.engine.ingest import publish_ingest, write_ingest_ssts
from slatepy.errors import FencedError
from slatepy.manifest import Manifest, SortedRun, SstHandle
from slatepy.store import open_store

POLICY = CompactionPolicy(l0_trigger=2, size_ratio=2.0, max_wal_ssts=10)


def sst(name: str, size: int = 100) -> SstHandle:
    return SstHandle(name, size, b"a", b"z", 1)


def test_wal_comes_first_and_is_bounded() -> None:
    manifest = Manifest(wal_id_last_compacted=4, wal_id_last_seen=4, l0=(sst("x"), sst("y")))
    assert plan(manifest, 30, POLICY) == WalToL0(5, 14)
    assert plan(manifest, 6, POLICY) == WalToL0(5, 6)


def test_nothing_to_do() -> None:
    assert plan(Manifest(wal_id_last_compacted=3, wal_id_last_seen=3), 3, POLICY) is None
    assert plan(Manifest(l0=(sst("x"),)), None, POLICY) is None


def test_size_tiered_selection_stops_at_a_much_larger_run() -> None:
    manifest = Manifest(
        l0=(sst("a"), sst("b")),
        sorted_runs=(
            SortedRun(3, (sst("r3", 300),)),  # <= 2 * 200: merged
            SortedRun(2, (sst("r2", 5000),)),  # > 2 * 500: stops here
            SortedRun(1, (sst("r1", 100),)),
        ),
    )
    assert plan(manifest, None, POLICY) == L0ToRun(("a", "b"), (3,), 4, drop_tombstones=False)


def test_tombstones_drop_only_when_the_oldest_run_is_merged() -> None:
    manifest = Manifest(l0=(sst("a"), sst("b")), sorted_runs=(SortedRun(1, (sst("r1"),)),))
    assert plan(manifest, None, POLICY) == L0ToRun(("a", "b"), (1,), 2, drop_tombstones=True)


def test_apply_wal_to_l0() -> None:
    manifest = Manifest(
        compactor_epoch=2, wal_id_last_compacted=4, wal_id_last_seen=4, l0=(sst("old"),)
    )
    new = apply_result(manifest, WalToL0(5, 9), (sst("new"),), 2)
    assert [h.id for h in new.l0] == ["new", "old"]
    assert new.wal_id_last_compacted == 9 and new.wal_id_last_seen == 9


def test_apply_l0_to_run_keeps_newer_l0_and_older_runs() -> None:
    manifest = Manifest(
        compactor_epoch=1,
        l0=(sst("newer"), sst("a"), sst("b")),
        sorted_runs=(SortedRun(2, (sst("r2"),)), SortedRun(1, (sst("r1"),))),
    )
    done = L0ToRun(("a", "b"), (2,), 3, drop_tombstones=False)
    new = apply_result(manifest, done, (sst("o1"), sst("o2")), 1)
    assert [h.id for h in new.l0] == ["newer"]
    assert [(r.id, [h.id for h in r.ssts]) for r in new.sorted_runs] == [
        (3, ["o1", "o2"]),
        (1, ["r1"]),
    ]


def test_zombie_compactor_cannot_publish() -> None:
    manifest = Manifest(compactor_epoch=3, wal_id_last_compacted=0, wal_id_last_seen=0)
    with pytest.raises(FencedError, match="superseded"):
        apply_result(manifest, WalToL0(1, 2), (sst("x"),), 2)


def test_inputs_compacted_meanwhile_are_refused() -> None:
    manifest = Manifest(compactor_epoch=1, l0=(sst("a"),))
    with pytest.raises(FencedError):
        apply_result(manifest, L0ToRun(("a", "gone"), (), 1, True), (), 1)
    with pytest.raises(FencedError):
        apply_result(
            Manifest(compactor_epoch=1, wal_id_last_compacted=5, wal_id_last_seen=5),
            WalToL0(3, 4),
            (),
            1,
        )


def test_l0_is_merged_before_the_wal_once_it_holds_l0_max_ssts() -> None:
    # Under a sustained write load there is always WAL: WAL-first alone would never merge L0.
    policy = CompactionPolicy(l0_trigger=2, size_ratio=2.0, max_wal_ssts=10, l0_max=3)
    l0 = (sst("x"), sst("y"), sst("z"))
    manifest = Manifest(wal_id_last_compacted=4, wal_id_last_seen=4, l0=l0)
    assert plan(manifest, 30, policy) == L0ToRun(("x", "y", "z"), (), 1, drop_tombstones=True)
    fewer = msgspec.structs.replace(manifest, l0=l0[:2])
    assert plan(fewer, 30, policy) == WalToL0(5, 14)
    # After a failed L0 merge the WAL goes first, so the merge does not hold every write.
    assert plan(manifest, 30, policy, wal_first=True) == WalToL0(5, 14)
    assert isinstance(plan(manifest, 4, policy, wal_first=True), L0ToRun)  # no WAL: retried


def test_the_wal_stays_first_while_l0_holds_an_ingested_sst() -> None:
    # The WAL may hold writes older than the ingestion; moved to a run first, the ingested
    # SST would be shadowed by them once they reach L0 (reads order L0 before every run).
    policy = CompactionPolicy(l0_trigger=2, max_wal_ssts=10, l0_max=3)
    ingested = msgspec.structs.replace(sst("z"), global_seq=7)
    manifest = Manifest(
        wal_id_last_compacted=4, wal_id_last_seen=4, l0=(sst("x"), sst("y"), ingested)
    )
    assert plan(manifest, 30, policy) == WalToL0(5, 14)
    assert isinstance(plan(manifest, 4, policy), L0ToRun)  # the WAL drained: L0 merges


def test_a_write_older_than_an_ingestion_never_shadows_it_after_l0_reaches_l0_max() -> None:
    store = open_store("memory://")
    settings = Settings(compactor="off")
    with Db.open(store, settings=settings) as db:
        compactor = Compactor(store, policy=CompactionPolicy(l0_trigger=2, l0_max=2))
        for key in (b"a", b"b"):  # L0 at l0_max
            db.put(key, b"1")
            assert isinstance(compactor.run_once(), WalToL0)
        db.put(b"k", b"old")  # acknowledged, still in the WAL
        handles = write_ingest_ssts(store, [(b"k", b"new")], settings, target_sst_bytes=1 << 20)
        publish_ingest(store, settings, handles)  # newer than every acknowledged write
        for _ in range(3):
            compactor.run_once()
    with Db.open(store, settings=settings) as db:
        assert db.get(b"k") == b"new"


def test_a_full_compaction_merges_every_source_into_one_run() -> None:
    from slatepy.compactor.planner import plan_full

    big, small = SortedRun(1, (sst("b1", 10_000), sst("b2", 10_000))), SortedRun(2, (sst("s"),))
    # Size-tiering leaves the large run alone; a full compaction takes it too.
    manifest = Manifest(l0=(sst("x"), sst("y")), sorted_runs=(small, big))
    assert plan(manifest, None, POLICY) == L0ToRun(("x", "y"), (2,), 3, False)
    assert plan_full(manifest) == L0ToRun(("x", "y"), (2, 1), 3, True)
    assert plan_full(Manifest(sorted_runs=(small, big))) == L0ToRun((), (2, 1), 3, True)
    # One source already: nothing to merge.
    assert plan_full(Manifest(sorted_runs=(big,))) is None
    assert plan_full(Manifest(l0=(sst("x"),))) is None
    assert plan_full(Manifest()) is None


def test_a_full_compaction_merges_once_while_a_writer_goes_on(tmp_path: object) -> None:
    """``run_until_idle(full=True)`` beside a live writer: after the merge the writer adds
    WAL, which the next round compacts into L0; that new L0 SST must not set off another
    rewrite of the whole database (review: a full compaction alternated WAL and full merges
    until ``max_rounds``)."""
    store = open_store(f"file://{tmp_path}/db", create=True)
    with Db.open(store, settings=Settings(compactor="off")) as db:
        for i in range(3):
            db.put(b"k%d" % i, b"v")
        # No size-tiered merge on the way (a high trigger): every L0ToRun is a full one.
        compactor = Compactor(store, settings=Settings(), policy=CompactionPolicy(l0_trigger=99))
        compactor.run_until_idle()  # the WAL into L0
        db.put(b"k3", b"v")
        compactor.run_until_idle()  # a second L0 SST: two sources to merge
        plans: list[object] = []
        run_once = compactor.run_once

        def writer_goes_on(**kwargs: bool) -> object:
            todo = run_once(**kwargs)  # type: ignore[arg-type]
            plans.append(todo)
            if isinstance(todo, L0ToRun):
                db.put(b"w%d" % len(plans), b"v")
            return todo

        compactor.run_once = writer_goes_on  # type: ignore[method-assign,assignment]
        rounds = compactor.run_until_idle(full=True, max_rounds=12)
        compactor.release()
    assert rounds == 2 and [type(p) for p in plans] == [L0ToRun, WalToL0, type(None)]


def test_a_close_merges_l0_alone_when_the_runs_do_not_fit_its_budget() -> None:
    manifest = Manifest(
        l0=(sst("a"), sst("b")),
        sorted_runs=(SortedRun(3, (sst("r3", 300),)), SortedRun(2, (sst("r2", 500),))),
    )
    both = L0ToRun(("a", "b"), (3, 2), 4, drop_tombstones=True)
    assert plan(manifest, None, POLICY) == both  # size-tiering takes both runs
    assert plan(manifest, None, POLICY, close_budget=1000) == both
    alone = L0ToRun(("a", "b"), (), 4, drop_tombstones=False)
    assert plan(manifest, None, POLICY, close_budget=999) == alone  # never a part of them
    assert plan(manifest, None, POLICY, close_budget=200) == alone
    # L0 alone does not fit: nothing (the close would abandon it), but the WAL still goes.
    assert plan(manifest, None, POLICY, close_budget=199) is None
    full = CompactionPolicy(l0_trigger=2, l0_max=2, size_ratio=2.0, max_wal_ssts=10)
    with_wal = msgspec.structs.replace(manifest, wal_id_last_compacted=4, wal_id_last_seen=4)
    assert isinstance(plan(with_wal, 30, full, close_budget=10_000), L0ToRun)
    assert plan(with_wal, 30, full, close_budget=199) == WalToL0(5, 14)


def test_a_close_adds_a_run_only_below_close_max_runs() -> None:
    from slatepy.compactor.planner import CLOSE_MAX_RUNS

    runs = tuple(SortedRun(i, (sst(f"r{i}", 300),)) for i in range(CLOSE_MAX_RUNS, 0, -1))
    manifest = Manifest(l0=(sst("a"), sst("b")), sorted_runs=runs)
    # Size-tiering would take runs along; the budget fits L0 alone, which adds a run.
    assert plan(manifest, None, POLICY, close_budget=500) is None
    fewer = msgspec.structs.replace(manifest, sorted_runs=runs[1:])
    assert plan(fewer, None, POLICY, close_budget=500) == L0ToRun(
        ("a", "b"), (), CLOSE_MAX_RUNS, False
    )
    # L0 that takes no run along adds one anyway, as size-tiering does however many exist.
    small = msgspec.structs.replace(manifest, l0=(sst("a", 10), sst("b", 10)))
    assert plan(small, None, POLICY, close_budget=500) == L0ToRun(
        ("a", "b"), (), CLOSE_MAX_RUNS + 1, False
    )


def test_closes_with_a_tight_budget_keep_the_run_count_bounded() -> None:
    """A process that writes two L0 SSTs and closes, 300 times, each close able to merge
    little more than its L0, and its compactor merging L0 at ``l0_trigger`` while it runs:
    the run count stays bounded (merging L0 alone at every close grew it by one each time),
    and no close's merge exceeds its budget."""
    from slatepy.compactor.planner import CLOSE_MAX_RUNS

    policy = CompactionPolicy(l0_trigger=4, size_ratio=4.0)
    closing = CompactionPolicy(l0_trigger=2, size_ratio=4.0)
    manifest = Manifest(sorted_runs=(SortedRun(1, (sst("base", 100_000),)),))
    budget, made = 700, 0

    def run(todo: L0ToRun) -> int:
        nonlocal manifest, made
        inputs = [h for h in manifest.l0 if h.id in todo.l0_ids] + [
            h for r in manifest.sorted_runs if r.id in todo.run_ids for h in r.ssts
        ]
        size = sum(h.object_size for h in inputs)
        made += 1
        manifest = apply_result(manifest, todo, (sst(f"o{made}", size),), 0)
        return size

    for close in range(300):
        for i in range(2):
            made += 1
            manifest = msgspec.structs.replace(
                manifest, l0=(sst(f"l{made}", 150 + 50 * i + close % 7), *manifest.l0)
            )
            todo = plan(manifest, None, policy)
            if todo is not None:
                assert isinstance(todo, L0ToRun)
                run(todo)
        todo = plan(manifest, None, closing, close_budget=budget)
        if todo is not None:
            assert isinstance(todo, L0ToRun)
            assert run(todo) <= budget
        assert len(manifest.sorted_runs) <= CLOSE_MAX_RUNS + 2, close
