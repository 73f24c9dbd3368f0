"""Materialize-style scenarios across handles and clients: lost CAS replies and the
idempotency token (RFC 0015 §6.2, §13.3 cases 2-6), random consensus faults, replicas
appending the same data, since downgrades by leased, critical and mixed readers (§13.3
case 14), closed frontiers, consolidation, and listens across clients."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from slatepy.config import Settings
from slatepy.errors import StoreUnavailable
from slatepy.persist import (
    Indeterminate,
    PersistClient,
    PersistSettings,
    Progress,
    ReadHandle,
    SinceError,
    SinceHandle,
    Updates,
    UpperMismatch,
    UsageError,
    WriteHandle,
    frontier,
)
from slatepy.persist.consolidation import consolidate
from slatepy.persist.location.consensus import Consensus
from slatepy.persist.location.objconsensus import ObjectConsensus
from slatepy.persist.location.pgconsensus import PostgresConsensus
from slatepy.persist.parts import PartWriter, merge_runs
from slatepy.persist.state.spine import Applied as MergeApplied
from slatepy.persist.state.spine import ApplyMerge, apply_merge
from slatepy.store.base import ObjectStore
from slatepy.store.stack import open_stack
from slatepy.table.reader import TableReader
from slatepy.testing.faults import FaultRates
from slatepy.testing.persist_faults import (
    FaultyConsensus,
    InterceptConsensus,
    consensus_uniform,
)
from tests.conftest import Backend
from tests.persist.compaction_kit import compact_all, manual
from tests.persist.handles_kit import (  # noqa: F401 (fixtures)
    SHARD,
    TEST_SETTINGS,
    Clock,
    client_fixture,
    state_of,
    url_fixture,
    validate_states,
)
from tests.processes import spawn

Update = tuple[tuple[bytes, bytes], int, int]
T = TypeVar("T")


def upd(key: bytes, time: int, diff: int = 1) -> Update:
    return (key, b"v"), time, diff


def snapshot(client: PersistClient, as_of: int) -> list[Update]:
    read = client.open_leased_reader(SHARD)
    try:
        return read.snapshot(as_of)
    finally:
        read.expire()


# -- indefinite failures ------------------------------------------------------------------


def test_a_lost_cas_reply_commits_once(store: ObjectStore, log: Consensus) -> None:
    faulty = FaultyConsensus(log, {"compare_and_set": FaultRates(lost_reply=1.0)})
    with PersistClient.open(store, consensus=faulty, settings=TEST_SETTINGS) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([upd(b"a", 0)], 0, 1)
        write.compare_and_append([upd(b"b", 1)], 1, 2)
        assert write.upper == 2
        faulty.enabled = False
        assert snapshot(client, 1) == [upd(b"a", 1), upd(b"b", 1)]
    assert faulty.counts["compare_and_set:lost_reply"] >= 2


def lose_reply_after(
    hook: Callable[[], None],
) -> Callable[[str, str | None], None]:
    """An ``after`` hook: on the first armed CAS, run ``hook`` then lose the reply."""
    armed = [False]

    def after(op: str, key: str | None) -> None:
        if op == "compare_and_set" and armed[0]:
            armed[0] = False
            hook()
            raise StoreUnavailable("injected: reply lost", definite=False)

    after.arm = lambda: armed.__setitem__(0, True)  # type: ignore[attr-defined]
    return after


def churn_and_truncate(other: PersistClient, log: Consensus) -> None:
    """Another client commits until it rolled up, then the log is truncated to that rollup:
    the lost attempt's entry is gone, only its token can tell."""
    for i in range(4):
        other.open_critical_since(SHARD, f"c{i}")
    rollups = other.machine(SHARD).state.rollups
    assert rollups
    assert log.truncate(SHARD, max(rollups)) > 0


ROLLING = PersistSettings(
    rollup_min_bytes=0,
    rollup_min_diffs=1,
    writer_lease=10.0,
    batch_lease=10.0,
    consensus_min_age=1.0,
    allow_short_leases=True,
)


def test_the_token_decides_when_the_log_no_longer_shows_the_attempt(
    store: ObjectStore, log: Consensus
) -> None:
    with PersistClient.open(store, consensus=log, settings=ROLLING) as other:
        after = lose_reply_after(lambda: churn_and_truncate(other, log))
        intercept = InterceptConsensus(log, after=after)
        with PersistClient.open(store, consensus=intercept, settings=TEST_SETTINGS) as client:
            write = client.open_writer(SHARD)
            write.compare_and_append([], 0, 1)
            after.arm()  # type: ignore[attr-defined]
            write.compare_and_append([upd(b"a", 1)], 1, 2)  # AlreadyCommitted by token
            assert write.upper == 2
            assert snapshot(client, 1) == [upd(b"a", 1)]


def test_an_expired_writer_leaves_an_uncertain_append_indeterminate(
    store: ObjectStore, log: Consensus
) -> None:
    clock = Clock()

    def expire_then_churn() -> None:
        clock.advance(60)  # past writer_lease: the next commit drops the writer
        churn_and_truncate(other, log)

    with PersistClient.open(store, consensus=log, settings=ROLLING, clock=clock) as other:
        after = lose_reply_after(expire_then_churn)
        intercept = InterceptConsensus(log, after=after)
        with PersistClient.open(store, consensus=intercept, settings=ROLLING, clock=clock) as a:
            write = a.open_writer(SHARD)
            write.compare_and_append([], 0, 1)
            after.arm()  # type: ignore[attr-defined]
            with pytest.raises(Indeterminate) as info:
                write.compare_and_append([upd(b"a", 1)], 1, 2)
            assert info.value.definite is False


def test_an_attempt_that_never_acted_loses_to_another_writer(
    store: ObjectStore, log: Consensus
) -> None:
    with PersistClient.open(store, consensus=log, settings=TEST_SETTINGS) as other:
        rival = other.open_writer(SHARD)
        armed = [False]

        def before(op: str, key: str | None) -> None:
            if op == "compare_and_set" and armed[0]:
                armed[0] = False
                rival.compare_and_append([upd(b"r", 1)], 1, 2)
                raise StoreUnavailable("injected: request lost", definite=False)

        intercept = InterceptConsensus(log, before=before)
        with PersistClient.open(store, consensus=intercept, settings=TEST_SETTINGS) as client:
            write = client.open_writer(SHARD)
            write.compare_and_append([], 0, 1)
            armed[0] = True
            with pytest.raises(UpperMismatch) as info:
                write.compare_and_append([upd(b"a", 1)], 1, 2)
            assert info.value.current == 2
            assert snapshot(client, 1) == [upd(b"r", 1)]


@pytest.mark.parametrize("kind", ["writer", "leased reader", "critical since"])
def test_an_expire_that_failed_can_be_called_again(
    store: ObjectStore, log: Consensus, kind: str
) -> None:
    """Found by ``test_model``: ``expire`` marked the handle expired before its state change,
    so after a failed change every later ``expire`` returned at once and the registration
    stayed (a critical since, which never lapses, held the shard's since for good)."""
    faulty = FaultyConsensus(log, {"compare_and_set": FaultRates(fail=1.0)}, enabled=False)
    with PersistClient.open(store, consensus=faulty, settings=TEST_SETTINGS) as client:
        write = client.open_writer(SHARD)
        write.compare_and_append([], 0, 1)
        handle: WriteHandle | ReadHandle | SinceHandle
        if kind == "writer":
            handle = write
        elif kind == "leased reader":
            handle = client.open_leased_reader(SHARD)
        else:
            handle = client.open_critical_since(SHARD, "controller")
        faulty.enabled = True
        with pytest.raises(StoreUnavailable):
            handle.expire()
        faulty.enabled = False
        handle.expire()
        state = state_of(client)
        registered = {*state.writers, *state.leased_readers, *state.critical_readers}
        ident = handle.writer_id if isinstance(handle, WriteHandle) else handle.reader_id
        assert ident not in registered


def test_a_downgrade_that_may_have_landed_is_not_read_below(
    store: ObjectStore, log: Consensus
) -> None:
    """An indefinite ``downgrade_since`` left the handle's since behind the committed one;
    after compaction forwarded times to the new since, a snapshot below it passed the
    handle's check and answered wrong data (here: nothing). Reads now check the since the
    state holds for the reader: ``SinceError``, and the handle learns its since."""
    rates = {
        "compare_and_set": FaultRates(lost_reply=1.0),  # lands; the reply is lost
        "head": FaultRates(fail=1.0),  # and nothing can read it back
        "scan": FaultRates(fail=1.0),
    }
    faulty = FaultyConsensus(log, rates, enabled=False)
    with manual(PersistClient.open(store, consensus=faulty, settings=TEST_SETTINGS)) as client:
        write = client.open_writer(SHARD)
        for t in range(6):
            write.compare_and_append([upd(b"k%d" % t, t)], t, t + 1)
        read = client.open_leased_reader(SHARD)
        faulty.enabled = True
        with pytest.raises(StoreUnavailable) as info:
            read.downgrade_since(5)
        faulty.enabled = False
        assert not info.value.definite and read.since == 0
        assert state_of(client).since == 5  # it landed
        compact_all(client, write.writer_id)  # times <= 5 forwarded to 5
        with pytest.raises(SinceError):
            read.snapshot(2)
        assert read.since == 5
        with pytest.raises(SinceError):
            read.listen(3)
        assert read.snapshot(5) == [upd(b"k%d" % t, 5) for t in range(6)]


def test_random_consensus_faults_lose_and_duplicate_nothing(
    store: ObjectStore, log: Consensus
) -> None:
    faulty = FaultyConsensus(log, consensus_uniform(0.2), seed=7, enabled=False)
    acknowledged: set[Update] = set()
    uncertain: set[Update] = set()
    with PersistClient.open(store, consensus=faulty, settings=TEST_SETTINGS) as client:
        write = client.open_writer(SHARD)
        faulty.enabled = True
        for n in range(40):
            update = upd(b"%d" % n, 0)
            try:
                expected = write.fetch_recent_upper()
                assert expected is not None
                update = upd(b"%d" % n, expected)
                write.compare_and_append([update], expected, expected + 1)
                acknowledged.add(update)
            except UpperMismatch:
                pass
            except StoreUnavailable as exc:
                if not exc.definite:
                    uncertain.add(update)
        faulty.enabled = False
        upper = write.fetch_recent_upper()
        assert upper is not None and upper > 0
        contents = snapshot(client, upper - 1)
    assert sum(faulty.counts.values()) >= 5
    keys = {u[0] for u in contents}
    assert all(d == 1 for _, _, d in contents)  # never twice
    assert {u[0] for u in acknowledged} <= keys  # never lost
    assert keys <= {u[0] for u in acknowledged | uncertain}  # nothing else


# -- replicas, frontiers, consolidation ------------------------------------------------


def test_replicas_appending_the_same_stream_write_it_once(client: PersistClient) -> None:
    a, b = client.open_writer(SHARD), client.open_writer(SHARD)
    stream = [upd(b"k%d" % t, t) for t in range(12)]
    a.append(stream[0:4], 0, 4)
    b.append(stream[0:6], 0, 6)  # appends [4, 6)
    a.append(stream[4:9], 4, 9)  # appends [6, 9)
    b.append(stream[6:9], 6, 9)  # already there
    b.append(stream[9:12], 9, 12)
    assert snapshot(client, 11) == sorted(upd(u[0][0], 11) for u in stream)


def test_since_downgrades_by_leased_critical_and_mixed_readers(client: PersistClient) -> None:
    leased = client.open_leased_reader(SHARD)
    leased.downgrade_since(4)
    assert state_of(client).since == 4  # leased alone
    critical = client.open_critical_since(SHARD, "controller")
    assert critical.since == 4
    leased.downgrade_since(10)
    assert state_of(client).since == 4  # held by the critical reader
    critical.compare_and_downgrade_since(b"", b"1", 7)
    assert state_of(client).since == 7  # meet of 10 and 7
    critical.compare_and_downgrade_since(b"1", b"2", 12)
    assert state_of(client).since == 10
    leased.expire()
    assert state_of(client).since == 12  # critical alone
    critical.compare_and_downgrade_since(b"2", b"3", None)
    assert state_of(client).since is None


def test_a_closed_shard_ends_listens_and_reads_at_any_time(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    read = client.open_leased_reader(SHARD)
    listen = read.listen(0)
    write.compare_and_append([upd(b"a", 1), upd(b"b", 2**63)], 0, None)
    assert list(listen) == [Updates([upd(b"a", 1), upd(b"b", 2**63)]), Progress(None)]
    assert read.snapshot(2**64 - 1) == [upd(b"a", 2**64 - 1), upd(b"b", 2**64 - 1)]
    sub = read.subscribe(5)
    assert list(sub) == [Updates([upd(b"a", 5)]), Updates([upd(b"b", 2**63)]), Progress(None)]


def test_snapshots_consolidate_across_batches_and_part_kinds(url: str) -> None:
    settings = PersistSettings(
        inline_part_max_bytes=256, batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True
    )
    with PersistClient.open(url, settings=settings) as client:
        write = client.open_writer(SHARD)
        model: dict[bytes, int] = {}
        for t in range(8):
            batch = [upd(b"k%02d" % ((t * 7 + i) % 20), t, 1 if i % 3 else -1) for i in range(25)]
            write.compare_and_append(batch if t % 2 else batch[:2], t, t + 1)
            for (key, _), _, diff in batch if t % 2 else batch[:2]:
                model[key] = model.get(key, 0) + diff
        kinds = {type(p).__name__ for b in state_of(client).trace for p in b.parts()}
        assert kinds == {"InlinePart", "HollowPart"}
        expected = sorted(upd(k, 7, d) for k, d in model.items() if d)
        assert snapshot(client, 7) == expected


def test_a_listen_in_another_client_sees_appends(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    with PersistClient.open(url) as writer_client, PersistClient.open(url) as reader_client:
        write = writer_client.open_writer(SHARD)
        listen = reader_client.open_leased_reader(SHARD).listen(0)
        timer = threading.Timer(0.1, lambda: write.compare_and_append([upd(b"a", 1)], 0, 2))
        timer.start()
        try:
            assert listen.fetch_next(timeout=10.0) == [Updates([upd(b"a", 1)]), Progress(2)]
        finally:
            timer.join()


def test_a_retry_that_stops_while_the_first_attempt_may_land_is_indeterminate(
    store: ObjectStore, log: Consensus
) -> None:
    clock = Clock()
    armed = [False]

    def before(op: str, key: str | None) -> None:
        if op == "compare_and_set" and armed[0]:
            armed[0] = False
            clock.advance(TEST_SETTINGS.batch_lease)  # the retry finds the batch too old
            raise StoreUnavailable("injected: request lost", definite=False)

    intercept = InterceptConsensus(log, before=before)
    with PersistClient.open(
        store, consensus=intercept, settings=TEST_SETTINGS, clock=clock
    ) as client:
        write = client.open_writer(SHARD)
        batch = write.batch([upd(b"a", 0)], 0, 1)
        armed[0] = True
        with pytest.raises(Indeterminate) as info:
            write.compare_and_append_batch([batch], 0, 1)
        assert isinstance(info.value.__cause__, UsageError)
        assert log.head(SHARD) is None


@pytest.fixture(params=["object-store", "postgresql"])
def consensus_factory(
    request: pytest.FixtureRequest,
) -> Iterator[Callable[[ObjectStore], Consensus]]:
    """Makes one consensus instance per client: the object-store log on its blob store, or
    a table on the session's PostgreSQL server (skipped without one)."""
    opened: list[Consensus] = []
    if request.param == "postgresql":  # resolved here: fixtures are not thread-safe
        server_url = request.getfixturevalue("postgres").url()
        table = request.getfixturevalue("pg_table")

    def make(blob: ObjectStore) -> Consensus:
        if request.param == "object-store":
            log: Consensus = ObjectConsensus(blob, min_age=0)
        else:
            log = PostgresConsensus(server_url, table=table)
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()


def test_clients_racing_on_one_shard_keep_one_chain(
    tmp_path: Path, consensus_factory: Callable[[ObjectStore], Consensus]
) -> None:
    """Two clients (like two processes), two writer threads sharing each client."""
    url = f"file://{tmp_path}"
    acknowledged: list[tuple[int, Update]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    blobs = [open_stack(url, Settings()) for _ in range(2)]
    clients = [
        PersistClient.open(blob, consensus=consensus_factory(blob), settings=TEST_SETTINGS)
        for blob in blobs
    ]

    def writer(name: int) -> None:
        try:
            write = clients[name % 2].open_writer(SHARD)
            done = 0
            for _ in range(200):
                expected = write.upper
                assert expected is not None
                update = upd(b"w%d-%d" % (name, done), expected)
                try:
                    write.compare_and_append([update], expected, expected + 1)
                except UpperMismatch:
                    continue
                with lock:
                    acknowledged.append((expected, update))
                done += 1
                if done == 5:
                    return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for client in clients:
            client.close()
    assert not errors, errors
    assert sorted(e for e, _ in acknowledged) == list(range(20))  # one chain from 0
    blob = open_stack(url, Settings())
    with PersistClient.open(blob, consensus=consensus_factory(blob)) as client:
        assert snapshot(client, 19) == sorted(upd(u[0][0], 19) for _, u in acknowledged)


def test_a_listen_follows_a_writer_in_another_process(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    with PersistClient.open(url) as client:
        listen = client.open_leased_reader(SHARD).listen(0)
        child = spawn("tests.persist.writer_process", url, SHARD, "20")
        try:
            updates: list[Update] = []
            uppers: list[int | None] = []
            deadline = time.monotonic() + 60
            while not listen.ended and time.monotonic() < deadline:
                for event in listen.fetch_next(timeout=1.0):
                    if isinstance(event, Updates):
                        updates.extend(event.updates)
                    else:  # everything delivered so far is before this upper
                        assert all(frontier.lt(t, event.upper) for _, t, _ in updates)
                        uppers.append(event.upper)
        finally:
            assert child.wait(60) == 0
    assert sorted(updates) == sorted(((b"k%d" % t, b"v"), t, 1) for t in range(1, 20))
    assert uppers[-1] is None
    closed = [u for u in uppers if u is not None]
    assert closed == sorted(set(closed))  # strictly increasing


def retrying(call: Callable[[], T], attempts: int = 20) -> T:
    """``call`` again while consensus fails (reads only: they are idempotent)."""
    for _ in range(attempts - 1):
        try:
            return call()
        except StoreUnavailable:
            continue
    return call()


def model_snapshot(model: list[Update], as_of: int) -> list[Update]:
    return consolidate([(kv, as_of, d) for kv, t, d in model if t <= as_of])


@pytest.mark.parametrize("seed", [1, 2, 5])
def test_a_random_workload_under_consensus_faults_matches_a_model(
    store: ObjectStore, log: Consensus, seed: int
) -> None:
    rng = random.Random(seed)
    rates = {
        "compare_and_set": FaultRates(fail=0.05, timeout=0.05, lost_reply=0.1),
        "head": FaultRates(fail=0.05, timeout=0.05),
        "scan": FaultRates(timeout=0.05),
    }
    faulty = FaultyConsensus(log, rates, seed=seed, enabled=False)
    model: list[Update] = []
    with PersistClient.open(store, consensus=faulty, settings=TEST_SETTINGS) as client:
        writers = [client.open_writer(SHARD), client.open_writer(SHARD)]
        read = client.open_leased_reader(SHARD)
        listen = read.listen(0)
        delivered: list[Update] = []
        faulty.enabled = True
        for _ in range(40):
            write = rng.choice(writers)
            lower = retrying(write.fetch_recent_upper)
            assert lower is not None
            upper = lower + rng.randint(1, 3)
            updates = [
                upd(b"k%d" % rng.randint(0, 5), rng.randrange(lower, upper), rng.choice([-1, 1]))
                for _ in range(rng.randint(0, 4))
            ]
            kind = rng.choice(["caa", "append", "batch"])
            try:
                if kind == "caa":
                    write.compare_and_append(updates, lower, upper)
                elif kind == "append":
                    write.append(updates, lower, upper)
                else:
                    batch = write.batch(updates, lower, upper)
                    write.compare_and_append_batch([batch], lower, upper)
            except StoreUnavailable as exc:
                # One writer at a time: the upper says whether the append landed.
                landed = retrying(write.fetch_recent_upper) == upper
                assert not (landed and exc.definite)  # a definite failure wrote nothing
                if not landed:
                    continue
            model.extend(updates)
            if rng.random() < 0.3:
                since = rng.randrange(0, upper)
                retrying(lambda since=since: read.downgrade_since(since))
            if rng.random() < 0.3:
                as_of = rng.randrange(0, upper)
                if frontier.le(read.since, as_of):
                    got = retrying(lambda as_of=as_of: read.snapshot(as_of))
                    assert got == model_snapshot(model, as_of)
            for event in retrying(lambda: listen.fetch_next(timeout=0.0)):
                if isinstance(event, Updates):
                    delivered.extend(event.updates)
        faulty.enabled = False
        final = write.fetch_recent_upper()
        assert final is not None
        while listen.frontier != final:
            for event in listen.fetch_next(timeout=1.0):
                if isinstance(event, Updates):
                    delivered.extend(event.updates)
    assert consolidate(delivered) == consolidate(u for u in model if u[1] > 0)
    assert sum(faulty.counts.values()) >= 5


def test_the_whole_api_on_every_backend(backend: Backend) -> None:
    """One pass over the public API on each store (memory, file, S3 over moto, S3 with the
    DynamoDB CAS...): blob and inline parts, shipping, reads, holds, finalization."""
    settings = PersistSettings(
        inline_part_max_bytes=256, batch_lease=10.0, consensus_min_age=1.0, allow_short_leases=True
    )
    target = backend.target() if backend.name == "memory" else backend.store()
    with PersistClient.open(target, settings=backend.settings, persist_settings=settings) as client:
        write = client.open_writer(SHARD)
        read = client.open_leased_reader(SHARD)
        listen = read.listen(0)
        write.compare_and_append([upd(b"a", 0), upd(b"b", 1)], 0, 2)
        big = [upd(b"k%03d" % i, 2) for i in range(50)]
        shipped = write.batch_from_bytes(write.batch(big, 2, 3).to_bytes())
        write.compare_and_append_batch([shipped], 2, 3)
        kinds = {type(p).__name__ for b in state_of(client).trace for p in b.parts()}
        assert kinds == {"InlinePart", "HollowPart"}
        assert read.snapshot(2) == sorted([upd(b"a", 2), upd(b"b", 2), *big])
        events = listen.fetch_next(timeout=5.0)
        assert events[-1] == Progress(3)
        since = client.open_critical_since(SHARD, "controller")
        since.compare_and_downgrade_since(b"", b"1", None)
        write.append([], 3, None)
        read.downgrade_since(None)
        read.expire()
        client.finalize_shard(SHARD)
        assert state_of(client).finalized


def merge_claims(client: PersistClient) -> int:
    """Do what the compactor will: merge every claimed span, forwarded to the shard's since
    (read through the public part reader), and apply it. Returns how many were applied."""
    machine = client.machine(SHARD)
    state = machine.fetch()
    assert state.since is not None
    tables = TableReader(client.blob)
    writer = PartWriter(client.blob, SHARD, "wcompactor", client.settings)
    applied = 0
    for merge_id, claim in state.merges.items():
        batches = [b for b in state.trace if b.id in claim.inputs]
        runs = [run for batch in batches for run in batch.runs]
        updates = consolidate(
            merge_runs(tables, SHARD, runs, memory_bytes=1 << 20), since=state.since
        )
        output = (writer.write_run(updates, inline_budget=0),) if updates else ()
        args = ApplyMerge(merge_id, claim.inputs, output, state.since, claim.claimant)
        result = machine.run(apply_merge, args)
        applied += isinstance(result, MergeApplied)
    return applied


def test_a_listen_across_compaction_delivers_nothing_twice(client: PersistClient) -> None:
    write = client.open_writer(SHARD)
    read = client.open_leased_reader(SHARD)
    listen = read.listen(0)
    delivered: list[Update] = []
    written: list[Update] = []
    for t in range(12):
        batch = [upd(b"k%d" % (t % 3), t), upd(b"k%d" % ((t + 1) % 3), t, -1)]
        write.compare_and_append(batch, t, t + 1)
        written.extend(batch)
        if t % 4 == 3:
            for event in listen.fetch_next(timeout=1.0):
                if isinstance(event, Updates):
                    delivered.extend(event.updates)
            read.downgrade_since(t + 1)  # held at frontier - 1 by the listen
            assert read.since == listen.frontier - 1  # type: ignore[operator]
            # Merges are claimed, or already applied (the trace holds fewer batches).
            assert merge_claims(client) > 0 or len(state_of(client).trace) < t + 1
    while listen.frontier != 12:
        for event in listen.fetch_next(timeout=1.0):
            if isinstance(event, Updates):
                delivered.extend(event.updates)
    assert all(t >= 1 for _, t, _ in delivered)
    assert consolidate(delivered) == consolidate(u for u in written if u[1] >= 1)
    assert len(state_of(client).trace) < 12  # compacted
