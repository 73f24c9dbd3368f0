"""Compaction execution (RFC 0015 §8.2, §13.3 cases 10-11): consolidation with times
forwarded to the since, snapshots unchanged, output parts, rounds, and the races of a merge
with appends, a second compactor, a lost apply reply and finalization."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import msgspec
import pytest

from slatepy.errors import StoreUnavailable
from slatepy.persist import PersistClient, PersistSettings, Progress, Updates
from slatepy.persist import compactor as compactor_module
from slatepy.persist.compactor import _fits_inline, compact
from slatepy.persist.location.consensus import Consensus
from slatepy.persist.state.records import Desc, HollowBatch, HollowPart, InlinePart, State
from slatepy.store.base import ObjectStore
from slatepy.testing.intercept import InterceptStore
from slatepy.testing.persist_faults import InterceptConsensus
from tests.persist.compaction_kit import (
    HOLLOW,
    claims,
    compact_all,
    is_output,
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
    url_fixture,
    validate_states,
)


@pytest.fixture(name="client")
def client_fixture(url: str) -> Iterator[PersistClient]:
    with manual(PersistClient.open(url, settings=HOLLOW)) as opened:
        yield opened


def test_a_merge_consolidates_with_times_forwarded_to_the_since(client: PersistClient) -> None:
    reader = client.open_leased_reader(SHARD)
    reader.downgrade_since(2)
    write = client.open_writer(SHARD)
    write.compare_and_append([upd(b"a", 0), upd(b"c", 0)], 0, 1)
    write.compare_and_append([upd(b"a", 1, -1), upd(b"b", 1)], 1, 2)
    write.compare_and_append([upd(b"c", 2)], 2, 3)
    before = reader.snapshot(2)
    results = compact_all(client, write.writer_id)
    assert [r.status for r in results] == ["applied", "applied"]
    state = state_of(client)
    (batch,) = state.trace
    assert (batch.desc.lower, batch.desc.upper, batch.desc.since) == (0, 3, 2)
    assert batch.updates == 2  # a cancelled; c@0 and c@2 met at 2
    assert all(is_output(key) for key in batch.part_keys())
    assert reader.snapshot(2) == before == [upd(b"b", 2), upd(b"c", 2, 2)]
    assert referenced(state) < part_paths(client)  # the inputs wait for GC


def test_a_snapshot_after_compaction_equals_the_snapshot_before(client: PersistClient) -> None:
    rng = random.Random(3)
    reader = client.open_leased_reader(SHARD)
    write = client.open_writer(SHARD)
    for t in range(6):
        updates = [upd(b"k%d" % rng.randrange(8), t, rng.choice((-1, 1))) for _ in range(20)]
        write.compare_and_append(updates, t, t + 1)
    reader.downgrade_since(3)
    before = {as_of: reader.snapshot(as_of) for as_of in (3, 4, 5)}
    assert all(r.status == "applied" for r in compact_all(client, write.writer_id))
    assert len(state_of(client).trace) < 6
    assert {as_of: reader.snapshot(as_of) for as_of in (3, 4, 5)} == before


def test_outputs_are_cut_at_part_target_bytes_and_rounds_leave_no_parts(url: str) -> None:
    settings = PersistSettings(
        small_merge_batches=2,
        batch_lease=10.0,
        consensus_min_age=1.0,
        allow_short_leases=True,
        inline_part_max_bytes=0,
        part_target_bytes=1024,
        builder_buffer_bytes=1024,
        compaction_memory_bytes=1 << 20,  # 16 runs of 64 KiB: more runs merge in rounds
    )
    with manual(PersistClient.open(url, settings=settings)) as client:
        write = client.open_writer(SHARD)
        for t in range(2):
            builder = write.builder(t)
            for i in range(400):  # ~25 runs of ~16 updates each
                builder.add(b"key%04d" % i, b"x" * 40, t, 1)
            batch = builder.finish(t + 1)
            write.compare_and_append_batch([batch], t, t + 1)
        assert sum(len(b.runs) for b in state_of(client).trace) > 32
        before = snapshot(client, 1)
        (result,) = compact_all(client, write.writer_id)
        assert result.status == "applied" and result.parts > 1 and result.updates == 800
        state = state_of(client)
        assert len(state.trace[0].runs) == 1
        assert snapshot(client, 1) == before
        # Inputs stay for readers until GC; intermediate rounds left nothing behind.
        compaction_outputs = {key for key in part_paths(client) if is_output(key)}
        assert compaction_outputs == referenced(state)


def test_an_append_between_claim_and_apply_does_not_stop_the_apply(
    client: PersistClient,
) -> None:
    write = client.open_writer(SHARD)
    write.compare_and_append([upd(b"a", 0)], 0, 1)
    write.compare_and_append([upd(b"b", 1)], 1, 2)
    (request,) = claims(state_of(client), write.writer_id)
    write.compare_and_append([upd(b"c", 2)], 2, 3)
    result = compact(client.machine(SHARD), client._tables, write.writer_id, request)
    assert result.status == "applied"
    assert snapshot(client, 2) == [upd(b"a", 2), upd(b"b", 2), upd(b"c", 2)]


def two_clients(
    store: ObjectStore, log: Consensus, hook: Callable[[str], None], clock: Clock
) -> tuple[PersistClient, PersistClient]:
    plain = manual(PersistClient.open(store, consensus=log, settings=HOLLOW, clock=clock))
    hooked = manual(
        PersistClient.open(
            InterceptStore(store, before_put=hook), consensus=log, settings=HOLLOW, clock=clock
        )
    )
    return plain, hooked


def test_after_a_takeover_one_compactor_applies_and_the_other_deletes_its_outputs(
    store: ObjectStore, log: Consensus
) -> None:
    clock = Clock()
    first_run: list[str] = []

    def before_put(path: str) -> None:
        # The second compactor writes its output: the first one finishes meanwhile.
        if is_output(path) and not first_run:
            first_run.append(compact(a.machine(SHARD), a._tables, wa.writer_id, old).status)

    a, b = two_clients(store, log, before_put, clock)
    with a, b:
        wa, wb = a.open_writer(SHARD), b.open_writer(SHARD)
        wa.compare_and_append([upd(b"a", 0)], 0, 1)
        wa.compare_and_append([upd(b"b", 1)], 1, 2)
        (old,) = claims(state_of(a), wa.writer_id)
        # b reads the state before the time passes: a process moves the walltime by the
        # time it has seen pass, plus max_clock_skew at most (RFC 0015, issue 27 addendum).
        b.machine(SHARD).fetch()
        clock.advance(HOLLOW.merge_lease + 1)
        wb.compare_and_append([upd(b"c", 2)], 2, 3)  # takes the expired claim over
        (new,) = claims(state_of(b), wb.writer_id)
        assert {batch.id for batch in old.inputs} <= {batch.id for batch in new.inputs}
        result = compact(b.machine(SHARD), b._tables, wb.writer_id, new)
        assert first_run == ["applied"] and result.status == "not_applied"
        state = state_of(a)
        assert not any(wb.writer_id in key for key in part_paths(a) if is_output(key))
        assert any(wa.writer_id in key for key in referenced(state))
        assert snapshot(a, 2) == [upd(b"a", 2), upd(b"b", 2), upd(b"c", 2)]


def test_a_lost_apply_reply_is_read_back_as_applied(store: ObjectStore, log: Consensus) -> None:
    armed = [False]

    def after(op: str, key: str | None) -> None:
        if op == "compare_and_set" and armed[0]:
            armed[0] = False
            raise StoreUnavailable("injected: reply lost", definite=False)

    with manual(
        PersistClient.open(store, consensus=InterceptConsensus(log, after=after), settings=HOLLOW)
    ) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        write.compare_and_append([upd(b"b", 1)], 1, 2)
        (request,) = claims(state_of(client), write.writer_id)
        armed[0] = True
        result = compact(client.machine(SHARD), client._tables, write.writer_id, request)
        assert result.status == "applied" and not armed[0]
        assert referenced(state_of(client)) <= part_paths(client)
        assert snapshot(client, 1) == [upd(b"a", 1), upd(b"b", 1)]


def test_a_landed_apply_is_applied_though_the_catch_up_after_it_fails_midway(
    store: ObjectStore, log: Consensus
) -> None:
    """Issue 27, defect 4: the apply lands, its reply is lost, another client commits 300
    changes, and the catch-up fails on its second page. The merge was answered NotApplied
    and its outputs, which the state references, deleted."""
    armed = {"cas": False, "scans": 0}

    def after(op: str, key: str | None) -> None:
        if op == "compare_and_set" and armed["cas"]:
            armed["cas"] = False
            reader = other.open_leased_reader(SHARD)
            for _ in range(300):  # more than one page (256) after ours
                reader.heartbeat()
            armed["scans"] = 1
            raise StoreUnavailable("injected: reply lost", definite=False)

    def before(op: str, key: str | None) -> None:
        if op == "scan" and armed["scans"]:
            armed["scans"] += 1
            if armed["scans"] == 3:
                raise StoreUnavailable("injected: the second page fails", definite=True)

    hooked = InterceptConsensus(log, before=before, after=after)
    with (
        manual(PersistClient.open(store, consensus=log, settings=HOLLOW)) as other,
        manual(PersistClient.open(store, consensus=hooked, settings=HOLLOW)) as client,
    ):
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        write.compare_and_append([upd(b"b", 1)], 1, 2)
        (request,) = claims(state_of(client), write.writer_id)
        armed["cas"] = True
        result = compact(client.machine(SHARD), client._tables, write.writer_id, request)
        assert armed["scans"] >= 3, "the catch-up never reached its second page"
        assert result.status == "applied"
        assert referenced(state_of(client)) <= part_paths(client)
        assert snapshot(client, 1) == [upd(b"a", 1), upd(b"b", 1)]


ROLLING = PersistSettings(
    rollup_min_bytes=0,
    rollup_min_diffs=1,
    batch_lease=10.0,
    consensus_min_age=1.0,
    allow_short_leases=True,
    inline_part_max_bytes=0,
)


def test_an_apply_the_log_no_longer_shows_keeps_its_outputs(
    store: ObjectStore, log: Consensus
) -> None:
    armed = [False]

    def after(op: str, key: str | None) -> None:
        if op == "compare_and_set" and armed[0]:
            armed[0] = False
            # Others commit and roll up, the log is truncated past our attempt: only the
            # state can tell that the merge landed.
            for i in range(4):
                other.open_critical_since(SHARD, f"c{i}")
            assert log.truncate(SHARD, max(other.machine(SHARD).fetch().rollups)) > 0
            raise StoreUnavailable("injected: reply lost", definite=False)

    with (
        manual(PersistClient.open(store, consensus=log, settings=ROLLING)) as other,
        manual(
            PersistClient.open(
                store, consensus=InterceptConsensus(log, after=after), settings=HOLLOW
            )
        ) as client,
    ):
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        write.compare_and_append([upd(b"b", 1)], 1, 2)
        (request,) = claims(state_of(client), write.writer_id)
        armed[0] = True
        result = compact(client.machine(SHARD), client._tables, write.writer_id, request)
        assert result.status == "applied"
        state = state_of(client)
        assert len(state.trace) == 1 and referenced(state) <= part_paths(client)


def test_a_merge_of_a_shard_finalized_meanwhile_is_not_applied(
    store: ObjectStore, log: Consensus
) -> None:
    clock = Clock()

    def before_put(path: str) -> None:
        if is_output(path) and not done:
            done.append(True)
            reader.downgrade_since(None)
            reader.expire()
            wa.compare_and_append([], 2, None)
            a.finalize_shard(SHARD)

    done: list[bool] = []
    a, b = two_clients(store, log, before_put, clock)
    with a, b:
        reader = a.open_leased_reader(SHARD)
        wa, wb = a.open_writer(SHARD), b.open_writer(SHARD)
        wb.compare_and_append([upd(b"a", 0)], 0, 1)
        wb.compare_and_append([upd(b"b", 1)], 1, 2)
        (request,) = claims(state_of(b), wb.writer_id)
        result = compact(b.machine(SHARD), b._tables, wb.writer_id, request)
        assert result.status == "not_applied"
        assert state_of(a).finalized
        assert not [key for key in part_paths(a) if is_output(key)]


def test_a_listen_across_compaction_delivers_nothing_twice_nor_below_its_frontier(
    client: PersistClient,
) -> None:
    write = client.open_writer(SHARD)
    reader = client.open_leased_reader(SHARD)
    write.compare_and_append([upd(b"a", 0)], 0, 1)
    listen = reader.listen(0)
    reader.downgrade_since(10)  # the listen holds it at frontier - 1
    write.compare_and_append([upd(b"b", 1), upd(b"z", 1)], 1, 2)
    assert listen.fetch_next(1.0) == [Updates([upd(b"b", 1), upd(b"z", 1)]), Progress(2)]
    assert state_of(client).since == 1
    write.compare_and_append([upd(b"c", 2), upd(b"z", 2, -1)], 2, 3)
    assert all(r.status == "applied" for r in compact_all(client, write.writer_id))
    (batch,) = state_of(client).trace  # delivered and undelivered batches merged
    assert batch.desc.since == 1
    assert listen.fetch_next(1.0) == [Updates([upd(b"c", 2), upd(b"z", 2, -1)]), Progress(3)]
    write.compare_and_append([upd(b"d", 3)], 3, 4)
    compact_all(client, write.writer_id)
    assert listen.fetch_next(1.0) == [Updates([upd(b"d", 3)]), Progress(4)]
    listen.close()


def test_a_long_merge_renews_its_claim(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compactor_module, "CHECK_EVERY", 50)
    settings = PersistSettings(
        small_merge_batches=2,
        batch_lease=10.0,
        consensus_min_age=1.0,
        allow_short_leases=True,
        inline_part_max_bytes=0,
        merge_lease=0.0001,  # renewal due at every check
    )
    with manual(PersistClient.open(url, settings=settings)) as client:
        write = client.open_writer(SHARD)
        for t in range(2):
            write.compare_and_append([upd(b"k%04d" % i, t) for i in range(500)], t, t + 1)
        (request,) = claims(state_of(client), write.writer_id)
        seqno = state_of(client).seqno
        result = compact(client.machine(SHARD), client._tables, write.writer_id, request)
        assert result.status == "applied"
        assert state_of(client).seqno - seqno > 2  # renewals, then the apply


def test_a_small_merge_output_is_inline(url: str) -> None:
    """Eight small inline batches merge into one inline part: no blob written, read or
    collected for them."""
    settings = PersistSettings(batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True)
    with manual(PersistClient.open(url, settings=settings)) as client:
        write = client.open_writer(SHARD)
        for t in range(8):
            write.compare_and_append([upd(b"k%d" % t, t)], t, t + 1)
        before = snapshot(client, 7)
        assert [r.status for r in compact_all(client, write.writer_id)] == ["applied"]
        (merged,) = state_of(client).trace
        assert (merged.desc.lower, merged.desc.upper, merged.updates) == (0, 8, 8)
        assert not list(merged.part_keys()) and not part_paths(client)
        assert snapshot(client, 7) == before


def test_an_output_is_inline_only_within_the_part_limit_and_the_states_room() -> None:
    hollow = (HollowPart("part/w/a.sst", 300, 5, b"", 0, 0),)
    inline = (InlinePart(b"x" * 300, 5),)
    roomy = PersistSettings(inline_part_max_bytes=1000, inline_state_max_bytes=10_000)
    full = PersistSettings(inline_part_max_bytes=1000, inline_state_max_bytes=1000)
    state = State.initial(SHARD)
    crowded = msgspec.structs.replace(
        state, trace=(HollowBatch(1, Desc(0, 1), (inline, inline, inline), 15),)
    )  # 900 inline bytes
    assert _fits_inline(state, [hollow, hollow, hollow], roomy)
    assert not _fits_inline(state, [hollow] * 4, roomy)  # 1,200 bytes > the part limit
    assert not _fits_inline(crowded, [hollow], full)  # 900 + 300 > the state's room
    assert _fits_inline(crowded, [inline, inline], full)  # replaces inline inputs: no growth


def test_a_shard_nobody_reads_still_merges_physically(client: PersistClient) -> None:
    """Issue 27: with the since closed, merges were skipped for ever, so writers to a shard
    nobody reads filled the trace and stalled. They merge now, forwarding nothing."""
    reader = client.open_leased_reader(SHARD)
    assert reader.downgrade_since(None) is None
    write = client.open_writer(SHARD)
    for t in range(4):
        write.compare_and_append([upd(b"k%d" % t, t), upd(b"x", t, 1 if t % 2 else -1)], t, t + 1)
    results = compact_all(client, write.writer_id)
    assert results and {r.status for r in results} == {"applied"}
    (batch,) = state_of(client).trace
    assert (batch.desc.lower, batch.desc.upper, batch.desc.since) == (0, 4, 0)
    # Nothing forwarded: x's updates at distinct times do not cancel.
    assert batch.updates == 8
