"""The load generator and the in-process ingest over it (RFC 0027 §4-§5)."""

from __future__ import annotations

import time

import pytest

from slatepy.persist import PersistClient
from slatepy.persist.consolidation import consolidate
from slatepy.sources import Ingest, IngestConflict, LoadGen, OffsetOutOfRange
from slatepy.sources.base import Chunk, Progress
from slatepy.sources.loadgen import contents, event


def collection(client: PersistClient, shard: str, as_of: int) -> dict[tuple[bytes, bytes], int]:
    reader = client.open_leased_reader(shard)
    try:
        return {kv: d for kv, _, d in consolidate(reader.snapshot(as_of), since=as_of)}
    finally:
        reader.expire()


def test_events_are_deterministic_and_retract() -> None:
    assert event(1, 7) == event(1, 7)
    (key, value, diff) = event(0, 4)[0]
    assert diff == -1 and (key, value, 1) == event(0, 2)[0]
    assert len(contents((5, 5))) == 6  # per partition: four inserts, one deleted


def test_a_read_below_the_committed_offset_fails() -> None:
    gen = LoadGen(2)
    reader = gen.open((0, 0))
    events = reader.poll(0.1)
    assert isinstance(events[-1], Progress) and events[-1].frontier == (1000, 1000)
    assert sum(isinstance(e, Chunk) for e in events) == 2000
    reader.commit((10, 20))
    with pytest.raises(OffsetOutOfRange, match=r"partition 0: offset 5 is below .* 10"):
        gen.open((5, 30))
    assert gen.open((10, 20)).poll(0.1)


def test_ingest_binds_offsets_and_resumes(client: PersistClient) -> None:
    gen = LoadGen(3, batch=50)
    ingest = Ingest(client, gen, data_shards=["orders"], remap_shard="orders.remap", tick=0)
    ingest.start()
    for _ in range(4):
        ingest.step()
    ingest.commit()
    first = ingest.stats()
    assert first.committed == gen.committed != (0, 0, 0)
    ingest.close()
    # A new ingest resumes where the shards say, re-reading nothing below the commit.
    again = Ingest(client, gen, data_shards=["orders"], remap_shard="orders.remap", tick=0)
    again.start()
    assert again.progress == first.committed
    for _ in range(3):
        again.step()
    again.commit()
    stats = again.stats()
    again.close()
    as_of = stats.resumption - 1
    assert collection(client, "orders", as_of) == contents(stats.committed)
    assert stats.committed == (350, 350, 350)
    remap_state = client.machine("orders.remap").fetch()
    assert remap_state.since == as_of


def test_a_rate_paces_the_generator() -> None:
    gen = LoadGen(2, rate=1000)
    time.sleep(0.05)
    reader = gen.open((0, 0))
    events = reader.poll(0.1)
    assert 10 <= sum(isinstance(e, Chunk) for e in events) <= 400


def test_the_remap_since_advances_and_its_size_stays_bounded(client: PersistClient) -> None:
    gen = LoadGen(2, batch=5)
    ingest = Ingest(client, gen, data_shards=["o"], remap_shard="o.remap", tick=0)
    ingest.start()
    sinces = []
    for i in range(600):
        ingest.step()
        if i % 30 == 29:
            ingest.commit()
            sinces.append(client.machine("o.remap").fetch().since)
    ingest.commit()
    client.wait_maintenance(10.0)
    state = client.machine("o.remap").fetch()
    assert sinces == sorted(sinces) and len(set(sinces)) == len(sinces)
    assert state.since == ingest.resumption - 1
    # 600 mints wrote 2,400 updates; compaction consolidates them at the since (the spine
    # keeps a few batches of older merges: measured 300-700 updates over 16,000 written).
    assert sum(b.updates for b in state.trace) < 600
    assert len(ingest.bindings.times) <= 2
    ingest.close()


def test_batches_end_on_bound_frontiers_when_catching_up() -> None:
    from slatepy.sources.remap import Bindings

    b = Bindings(2)
    for ts, f in ((0, (0, 0)), (5, (10, 4)), (9, (20, 8)), (12, (30, 9))):
        b.mint(ts, f)
    assert b.aligned((10, 4), (25, 8)) == (20, 8)  # the largest bound frontier that fits
    assert b.aligned((10, 4), (11, 5)) == (20, 8)  # none fits: the next one
    assert b.aligned((30, 9), (40, 20)) is None  # nothing bound beyond: mint
    assert b.time_of(0, 10) == 9 and b.time_of(1, 3) == 5 and b.time_of(0, 30) is None
    assert b.before(10) == (20, 8) and b.complete_upper((20, 8)) == 12


def test_an_idle_ingest_writes_no_state(client: PersistClient) -> None:
    gen = LoadGen(1, rate=0.001)  # nothing for the next hour
    ingest = Ingest(client, gen, data_shards=["idle"], remap_shard="idle.remap", tick=0)
    ingest.start()
    ingest.step()
    ingest.commit()
    seqnos = [client.machine(s).fetch().seqno for s in ("idle", "idle.remap")]
    for _ in range(5):
        ingest.step(0.01)
        ingest.commit()
    assert [client.machine(s).fetch().seqno for s in ("idle", "idle.remap")] == seqnos
    ingest.close()


def test_a_restart_commits_its_resumption_offsets(client: PersistClient) -> None:
    """A crash between the shards' appends and the upstream commit: the next start commits
    the offsets it resumes at even when nothing new arrives."""
    ingest = Ingest(client, LoadGen(2, batch=10), data_shards=["r"], remap_shard="r.remap", tick=0)
    ingest.start()
    ingest.step()
    ingest.step()
    ingest._append()  # durable in both shards; then "killed" before any commit
    ingest.close()
    upstream = LoadGen(2, rate=0.001)  # nothing new arrives; nothing committed yet
    again = Ingest(client, upstream, data_shards=["r"], remap_shard="r.remap", tick=0)
    again.start()
    again.step()
    again.commit()
    assert upstream.committed == again.progress == (20, 20)
    again.close()


def two_ingests(client: PersistClient, shard: str) -> tuple[LoadGen, Ingest, Ingest]:
    """Two ingests of one load generator into ``shard``, both started; the first has stepped
    (bound and appended), so the second's view of the shards is stale."""
    gen = LoadGen(2, batch=20)
    first = Ingest(client, gen, data_shards=[shard], remap_shard=f"{shard}.remap", tick=0)
    second = Ingest(client, gen, data_shards=[shard], remap_shard=f"{shard}.remap", tick=0)
    first.start()
    second.start()
    first.step()
    return gen, first, second


def test_a_second_concurrent_ingest_stops_naming_the_shard_and_holder(
    client: PersistClient,
) -> None:
    """Two ingests of the same shards at once: the one whose append finds the shard moved
    stops with IngestConflict naming the shard and the other writer; the first carries on,
    and a later start (as after the first died) resumes where the shards say."""
    gen, first, second = two_ingests(client, "g")
    with pytest.raises(IngestConflict, match=r"remap shard 'g.remap' moved .* ingest remap"):
        second.step()
    second.close()
    for _ in range(3):
        first.step()
    first.commit()
    upper = first.stats().data_uppers[0]
    first.close()
    assert collection(client, "g", upper - 1) == contents(first.bindings.before(upper))
    again = Ingest(client, gen, data_shards=["g"], remap_shard="g.remap", tick=0)
    again.start()
    again.step()
    again.commit()
    assert again.stats().data_uppers[0] > upper
    again.close()


def test_an_idle_source_still_advances_the_uppers(client: PersistClient) -> None:
    """No events upstream: the remap and data shards' uppers still follow the clock (progress
    without data), so a reader's frontier moves; no binding and no upstream commit change."""
    gen = LoadGen(1, rate=0.001)  # its first event in ~1,000 s
    ingest = Ingest(
        client, gen, data_shards=["idle"], remap_shard="idle.remap", tick=0, idle_interval=0
    )
    ingest.start()
    before = ingest.stats()
    deadline = time.monotonic() + 5
    while ingest.stats().data_uppers[0] <= max(before.data_uppers[0], 1):
        assert time.monotonic() < deadline, ingest.stats()
        ingest.step(0.01)
    ingest.commit()
    stats = ingest.stats()
    assert stats.remap_upper >= stats.data_uppers[0] > 1
    assert ingest.bindings.latest == (0,) and stats.committed == (0,)
    assert client.machine("idle").fetch().upper == stats.data_uppers[0]
    ingest.close()


def test_a_commit_does_not_adopt_uppers_another_ingest_moved(client: PersistClient) -> None:
    """The second ingest commits after the first appended (its commit re-reads the uppers):
    it must stop there, not take the moved uppers as its own and then bind and append the
    offsets the first already wrote (a corrupt remap shard, every row twice)."""
    _, first, second = two_ingests(client, "a")
    with pytest.raises(IngestConflict, match=r"remap shard 'a.remap' moved .* ingest remap"):
        second.commit()
        second.step()
    second.close()
    first.step()
    first.commit()
    upper = first.stats().data_uppers[0]
    first.close()
    got = collection(client, "a", upper - 1)
    assert set(got.values()) == {1} and got == contents(first.bindings.before(upper))
