"""GC passes (RFC 0015 §10, §13.3 cases 1, 8, 9, 12, 13): what a live reader can read stays,
leaked parts go only after ``batch_lease``, a paused append loses to the fence, consensus
is truncated below ``seqno_since`` onto a rollup, finalized shards shrink to one rollup and
the head, and a dry run writes nothing."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slatepy.config import Settings
from slatepy.persist import PersistClient, PersistSettings, UsageError
from slatepy.persist.compactor import compact
from slatepy.persist.consolidation import consolidate
from slatepy.persist.gc import collect
from slatepy.persist.location.consensus import Consensus
from slatepy.store.base import ObjectStore
from slatepy.testing.persist_faults import InterceptConsensus
from tests.conftest import make_backend
from tests.persist.compaction_kit import (
    HOLLOW,
    Update,
    claims,
    compact_all,
    manual,
    part_paths,
    referenced,
    snapshot,
    upd,
)
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    Clock,
    state_of,
    validate_states,
)

PAST_BATCH_LEASE = HOLLOW.batch_lease + 1

ROLLING = PersistSettings(
    rollup_min_bytes=0,
    rollup_min_diffs=1,
    batch_lease=10.0,
    consensus_min_age=1.0,
    allow_short_leases=True,
    inline_part_max_bytes=0,
)
"""A rollup after every commit, so truncation has rollups to land on."""


LOCATIONS = ["memory", "file", pytest.param("s3", marks=pytest.mark.s3)]


@pytest.fixture(name="location", params=LOCATIONS)
def location_fixture(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, Settings]]:
    """A fresh location (URL and store settings); S3 on the moto server."""
    if request.param == "memory":
        yield "memory://", Settings()
    elif request.param == "file":
        yield f"file://{tmp_path}", Settings()
    else:
        backend = make_backend("s3", request, tmp_path)
        yield backend.url, backend.settings


def open_client(
    location: tuple[str, Settings], clock: Clock, settings: PersistSettings = HOLLOW
) -> PersistClient:
    url, store_settings = location
    return manual(
        PersistClient.open(url, settings=store_settings, persist_settings=settings, clock=clock)
    )


def gc(client: PersistClient) -> None:
    assert collect(client.machine(SHARD), claimant="gc").status == "done"


def test_gc_keeps_every_part_a_reader_pinned_at_a_seqno_can_read(
    location: tuple[str, Settings],
) -> None:
    clock = Clock(time.time())
    with open_client(location, clock) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0), upd(b"b", 0)], 0, 1)
        write.compare_and_append([upd(b"c", 1)], 1, 2)
        reader = client.open_leased_reader(SHARD)
        stream = reader.snapshot_iter(1)  # pins this state; parts are read lazily
        inputs = referenced(state_of(client))
        assert [r.status for r in compact_all(client, write.writer_id)] == ["applied"]
        clock.advance(PAST_BATCH_LEASE)  # age protects nothing any more
        gc(client)
        assert inputs <= part_paths(client)
        assert list(stream) == [upd(b"a", 1), upd(b"b", 1), upd(b"c", 1)]
        reader.heartbeat()  # the stream is done: the reader holds the current state
        report = collect(client.machine(SHARD), claimant="gc")
        assert set(report.parts) == inputs
        assert part_paths(client) == referenced(state_of(client))
        assert reader.snapshot(1) == [upd(b"a", 1), upd(b"b", 1), upd(b"c", 1)]


def test_a_leaked_part_is_deleted_only_after_batch_lease(
    location: tuple[str, Settings],
) -> None:
    clock = Clock(time.time())
    with open_client(location, clock) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        write.batch([upd(b"leak", 1)], 1, 2)  # written, never applied: a crash before the CAS
        leaked = part_paths(client) - referenced(state_of(client))
        assert len(leaked) == 1
        gc(client)
        assert leaked <= part_paths(client)
        clock.advance(PAST_BATCH_LEASE)
        gc(client)
        assert part_paths(client) == referenced(state_of(client))
        assert snapshot(client, 0) == [upd(b"a", 0)]


def test_a_paused_batch_append_loses_to_the_fence_and_fails_the_age_check(
    store: ObjectStore, log: Consensus
) -> None:
    clock = Clock(time.time())
    paused = InterceptConsensus(log)
    with (
        manual(PersistClient.open(store, consensus=paused, settings=HOLLOW, clock=clock)) as client,
        manual(PersistClient.open(store, consensus=log, settings=HOLLOW, clock=clock)) as collector,
    ):
        write = client.open_writer(SHARD)
        batch = write.batch([upd(b"a", 0)], 0, 1)
        (part,) = part_paths(client)
        pause = paused.pause("compare_and_set", key=SHARD)
        errors: list[BaseException] = []

        def append() -> None:
            try:
                write.compare_and_append_batch([batch], 0, 1)
            except BaseException as exc:  # the test inspects it
                errors.append(exc)

        thread = threading.Thread(target=append)
        thread.start()
        pause.wait_reached()
        clock.advance(PAST_BATCH_LEASE)
        gc(collector)  # the fence lands first; the batch's part is old and unreferenced
        assert part not in part_paths(collector)
        pause.release()
        thread.join(10)
        assert len(errors) == 1 and isinstance(errors[0], UsageError)
        assert "too old" in str(errors[0])
        assert state_of(collector).upper == 0 and not state_of(collector).trace


def test_an_append_that_lands_before_the_fence_keeps_its_parts(
    location: tuple[str, Settings],
) -> None:
    clock = Clock(time.time())
    with open_client(location, clock) as client:
        write = client.open_writer(SHARD)
        batch = write.batch([upd(b"a", 0)], 0, 1)
        write.compare_and_append_batch([batch], 0, 1)
        clock.advance(PAST_BATCH_LEASE)
        gc(client)
        assert part_paths(client) == referenced(state_of(client)) != set()
        assert snapshot(client, 0) == [upd(b"a", 0)]


def test_consensus_is_truncated_below_seqno_since_onto_a_rollup(
    location: tuple[str, Settings],
) -> None:
    clock = Clock(time.time())
    with open_client(location, clock, ROLLING) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        reader = client.open_leased_reader(SHARD)  # holds its registration seqno
        held = state_of(client).leased_readers[reader.reader_id].seqno
        for t in range(1, 6):
            write.compare_and_append([upd(b"k", t)], t, t + 1)
        clock.advance(5)  # past consensus_min_age
        report = collect(client.machine(SHARD), claimant="gc")
        assert report.seqno_since == held
        assert report.truncated_to is not None and report.truncated_to <= held
        earliest = client.consensus.scan(SHARD, 1, 1)[0].seqno
        state = state_of(client)
        assert earliest == report.truncated_to == min(state.rollups)
        root = f"shards/{SHARD}/"
        blobs = {meta.path[len(root) :] for meta in client.blob.list(root + "rollup/")}
        assert {ref.key for ref in state.rollups.values()} <= blobs
        assert all(int(key[7:27]) >= earliest for key in blobs)
        # A fresh process loads the shard from the rollup and reads it.
        if location[0] != "memory://":  # a memory store is private to its client
            with open_client(location, clock) as other:
                assert snapshot(other, 5) == [upd(b"a", 5), upd(b"k", 5, 5)]
        reader.expire()
        clock.advance(5)
        later = collect(client.machine(SHARD), claimant="gc")
        assert later.truncated_to is not None and later.truncated_to > earliest


def test_finalize_then_gc_leaves_one_rollup_and_the_head(
    location: tuple[str, Settings],
) -> None:
    clock = Clock(time.time())
    with open_client(location, clock) as client:
        write = client.open_writer(SHARD)
        reader = client.open_leased_reader(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        write.compare_and_append([upd(b"b", 1)], 1, 2)
        compact_all(client, write.writer_id)
        reader.downgrade_since(None)
        reader.expire()
        write.compare_and_append([], 2, None)
        client.finalize_shard(SHARD)
        clock.advance(5)
        report = collect(client.machine(SHARD), claimant="gc")
        assert report.status == "done" and report.finalized
        assert part_paths(client) == set()
        state = state_of(client)
        root = f"shards/{SHARD}/"
        rollups = [meta.path[len(root) :] for meta in client.blob.list(root + "rollup/")]
        assert rollups == [ref.key for ref in state.rollups.values()]
        earliest = client.consensus.scan(SHARD, 1, 1)[0].seqno
        assert earliest == min(state.rollups) and state.seqno - earliest <= 2
        again = collect(client.machine(SHARD), claimant="gc")
        assert again.status == "skipped" and state_of(client).seqno == state.seqno
        with pytest.raises(UsageError):
            client.open_writer(SHARD)


def test_a_dry_run_writes_nothing_and_returns_the_plan(location: tuple[str, Settings]) -> None:
    clock = Clock(time.time())
    with open_client(location, clock) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        write.batch([upd(b"leak", 1)], 1, 2)
        clock.advance(PAST_BATCH_LEASE)
        seqno, parts = state_of(client).seqno, part_paths(client)
        plan = collect(client.machine(SHARD), claimant="gc", mode="dry-run")
        assert plan.status == "planned" and plan.fence is None
        assert set(plan.parts) == parts - referenced(state_of(client))
        assert state_of(client).seqno == seqno and part_paths(client) == parts


def test_an_expired_reader_releases_its_parts(location: tuple[str, Settings]) -> None:
    clock = Clock(time.time())
    with open_client(location, clock) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        write.compare_and_append([upd(b"b", 1)], 1, 2)
        reader = client.open_leased_reader(SHARD)
        inputs = referenced(state_of(client))
        compact_all(client, write.writer_id)
        clock.advance(HOLLOW.reader_lease + 1)  # no heartbeat: the next commit expires it
        write.compare_and_append([], 2, 3)
        gc(client)
        assert not inputs & part_paths(client)
        with pytest.raises(UsageError):
            reader.snapshot(1)


def test_appends_merges_and_gc_interleaved_lose_nothing_a_reader_reads(
    store: ObjectStore, log: Consensus
) -> None:
    """A seeded random workload: appends, merges, GC passes past batch_lease and snapshot
    streams opened at one state and read several steps later, against a multiset model."""
    rng = random.Random(11)
    clock = Clock(time.time())
    with manual(PersistClient.open(store, consensus=log, settings=HOLLOW, clock=clock)) as client:
        write = client.open_writer(SHARD)
        reader = client.open_leased_reader(SHARD)
        model: list[Update] = []
        streams: list[tuple[Iterator[Update], list[Update]]] = []
        for t in range(40):
            updates = [upd(b"k%d" % rng.randrange(6), t, rng.choice((-1, 1))) for _ in range(5)]
            write.compare_and_append(updates, t, t + 1)
            model.extend(updates)
            action = rng.randrange(4)
            if action == 0:
                compact_all(client, write.writer_id)
            elif action == 1:
                clock.advance(PAST_BATCH_LEASE)
                gc(client)
            elif action == 2 and len(streams) < 3:
                streams.append((reader.snapshot_iter(t), expected_at(model, t)))
            elif streams:
                stream, expected = streams.pop(0)
                assert list(stream) == expected
                reader.heartbeat()
        for stream, expected in streams:
            assert list(stream) == expected
        reader.heartbeat()
        clock.advance(PAST_BATCH_LEASE)
        gc(client)
        assert part_paths(client) == referenced(state_of(client))
        assert reader.snapshot(39) == expected_at(model, 39)


def expected_at(model: list[Update], as_of: int) -> list[Update]:
    """The consolidated snapshot of ``model`` as of ``as_of`` (since 0: times kept)."""
    return consolidate([((k, v), as_of, d) for (k, v), t, d in model if t <= as_of])


def test_a_loader_whose_rollup_gc_deleted_reads_the_head_again(
    store: ObjectStore, log: Consensus
) -> None:
    paused = InterceptConsensus(log)
    with manual(PersistClient.open(store, consensus=log, settings=ROLLING)) as writer_client:
        write = writer_client.open_writer(SHARD)
        for t in range(3):
            write.compare_and_append([upd(b"k", t)], t, t + 1)
        named = max(state_of(writer_client).rollups)
        with manual(PersistClient.open(store, consensus=paused, settings=ROLLING)) as loader:
            pause = paused.pause("head", key=SHARD, when="after")
            loaded: list[int] = []
            thread = threading.Thread(target=lambda: loaded.append(state_of(loader).seqno))
            thread.start()
            pause.wait_reached()  # the loader holds a head naming rollup `named`
            for t in range(3, 6):
                write.compare_and_append([upd(b"k", t)], t, t + 1)
            report = collect(writer_client.machine(SHARD), claimant="gc")
            assert report.truncated_to is not None and report.truncated_to > named
            assert any(int(key[7:27]) == named for key in report.rollups)
            pause.release()
            thread.join(10)
            assert loaded and loaded[0] >= report.truncated_to
            assert snapshot(loader, 5) == [upd(b"k", 5, 6)]


def test_a_merge_apply_paused_across_a_gc_pass_is_abandoned(
    store: ObjectStore, log: Consensus
) -> None:
    clock = Clock(time.time())
    paused = InterceptConsensus(log)
    with (
        manual(PersistClient.open(store, consensus=paused, settings=HOLLOW, clock=clock)) as client,
        manual(PersistClient.open(store, consensus=log, settings=HOLLOW, clock=clock)) as collector,
    ):
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        write.compare_and_append([upd(b"b", 1)], 1, 2)
        (request,) = claims(state_of(client), write.writer_id)
        inputs = referenced(state_of(client))
        pause = paused.pause("compare_and_set", key=SHARD)
        results: list[str] = []
        thread = threading.Thread(
            target=lambda: results.append(
                compact(client.machine(SHARD), client._tables, write.writer_id, request).status
            )
        )
        thread.start()
        pause.wait_reached()  # outputs written, the apply about to CAS
        clock.advance(PAST_BATCH_LEASE)
        gc(collector)  # the fence lands first; the outputs look old and unreferenced
        pause.release()
        thread.join(10)
        assert results == ["abandoned"]  # the rerun found them too old to apply
        state = state_of(collector)
        assert len(state.trace) == 2 and part_paths(collector) == inputs == referenced(state)
        assert snapshot(collector, 1) == [upd(b"a", 1), upd(b"b", 1)]
