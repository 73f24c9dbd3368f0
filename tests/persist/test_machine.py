"""The applier (``persist/machine.py``) and the version cache (``persist/versions.py``):
cold loads, catch-up, lost races, indefinite failures, rollups and the digest chain."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from slatepy.config import Settings
from slatepy.errors import ClosedError, CorruptionError, StoreUnavailable
from slatepy.persist import machine as machine_module
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import StateConflictError, UsageError
from slatepy.persist.location.consensus import Consensus
from slatepy.persist.location.objconsensus import ObjectConsensus
from slatepy.persist.machine import ShardMachine, rerun_as_is
from slatepy.persist.state.diff import StateDiff, encode_state_diff
from slatepy.persist.state.records import State
from slatepy.persist.state.transitions import (
    CompareAndDowngradeSince,
    HeartbeatWriter,
    RegisterCriticalReader,
    RegisterWriter,
    compare_and_downgrade_since,
    heartbeat_writer,
    register_critical_reader,
    register_writer,
)
from slatepy.store.base import ObjectMeta, ObjectStore, PutData, PutMode, WrappingStore
from slatepy.store.stack import open_stack
from slatepy.testing.faults import FaultRates
from slatepy.testing.persist_faults import FaultyConsensus, InterceptConsensus

SHARD = "orders"


@pytest.fixture
def blob() -> ObjectStore:
    return open_stack("memory://", Settings())


@pytest.fixture
def consensus(blob: ObjectStore) -> Iterator[Consensus]:
    with ObjectConsensus(blob, min_age=0) as log:
        yield log


def make(
    consensus: Consensus, blob: ObjectStore, settings: PersistSettings | None = None
) -> ShardMachine:
    return ShardMachine(SHARD, consensus, blob, settings or PersistSettings(), validate=True)


def register(machine: ShardMachine, writer: str) -> None:
    machine.run(register_writer, RegisterWriter(writer), on_uncertain=rerun_as_is)


def test_the_first_command_commits_seqno_1_and_another_process_loads_it(
    consensus: Consensus, blob: ObjectStore
) -> None:
    a = make(consensus, blob)
    assert a.state == State.initial(SHARD)
    register(a, "w1")
    assert a.state.seqno == 1 and "w1" in a.state.writers
    head = consensus.head(SHARD)
    assert head is not None and head.seqno == 1
    b = make(consensus, blob)
    assert b.fetch() == a.state


def test_a_stale_machine_loses_the_race_catches_up_and_reruns(
    consensus: Consensus, blob: ObjectStore
) -> None:
    a, b = make(consensus, blob), make(consensus, blob)
    assert b.state.seqno == 0  # b's cache is loaded (and now stale)
    register(a, "w1")
    register(a, "w2")
    register(b, "w3")  # CAS at 1 loses, catches up to 2, commits 3
    assert b.state.seqno == 3 and set(b.state.writers) == {"w1", "w2", "w3"}
    assert a.fetch() == b.state


def test_a_lost_cas_reply_is_recognized_as_our_own_commit(
    consensus: Consensus, blob: ObjectStore
) -> None:
    faulty = FaultyConsensus(consensus, {"compare_and_set": FaultRates(lost_reply=1.0)})
    m = make(faulty, blob)
    register(m, "w1")
    assert faulty.counts["compare_and_set:lost_reply"] == 1
    assert m.state.seqno == 1
    assert len(consensus.scan(SHARD, 1, 10)) == 1  # written once, never twice


def test_a_non_idempotent_command_is_also_resolved_by_its_bytes(
    consensus: Consensus, blob: ObjectStore
) -> None:
    faulty = FaultyConsensus(consensus, {"compare_and_set": FaultRates(lost_reply=1.0)})
    m = make(faulty, blob)
    m.run(register_writer, RegisterWriter("w1"))  # no on_uncertain: still decided
    assert m.state.seqno == 1


def test_calls_that_never_act_give_up_with_an_indefinite_error(
    consensus: Consensus, blob: ObjectStore
) -> None:
    faulty = FaultyConsensus(consensus, {"compare_and_set": FaultRates(timeout=1.0)})
    m = make(faulty, blob)
    with pytest.raises(StoreUnavailable) as info:
        register(m, "w1")
    assert info.value.definite is False
    assert consensus.head(SHARD) is None


def test_a_definite_failure_is_raised_at_once_and_commits_nothing(
    consensus: Consensus, blob: ObjectStore
) -> None:
    faulty = FaultyConsensus(consensus, {"compare_and_set": FaultRates(fail=1.0)})
    m = make(faulty, blob)
    with pytest.raises(StoreUnavailable) as info:
        register(m, "w1")
    assert info.value.definite is True
    assert faulty.counts["compare_and_set:fail"] == 1
    assert consensus.head(SHARD) is None


def test_a_refusal_commits_nothing(consensus: Consensus, blob: ObjectStore) -> None:
    m = make(consensus, blob)
    with pytest.raises(UsageError, match="not registered"):
        m.run(heartbeat_writer, HeartbeatWriter("nobody"))
    assert consensus.head(SHARD) is None


def test_endless_lost_races_end_in_state_conflict(
    consensus: Consensus, blob: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(machine_module, "MAX_ATTEMPTS", 3)
    rival = make(consensus, blob)
    names = iter(range(100))

    def race(op: str, key: str | None) -> None:
        if op == "compare_and_set":
            register(rival, f"rival{next(names)}")

    m = make(InterceptConsensus(consensus, before=race), blob)
    with pytest.raises(StateConflictError, match="gave up after 3"):
        register(m, "w1")
    assert "w1" not in rival.fetch().writers


def test_rollups_are_written_when_due_and_cold_loads_start_from_them(
    consensus: Consensus, blob: ObjectStore
) -> None:
    settings = PersistSettings(rollup_min_bytes=0, rollup_min_diffs=3)
    m = make(consensus, blob, settings)
    for i in range(10):
        register(m, f"w{i}")
    rollups = m.state.rollups
    assert rollups, "a rollup is due after 3 diffs"
    assert all(blob.head(f"shards/{SHARD}/{ref.key}").size == ref.size for ref in rollups.values())
    latest = max(rollups)
    # Truncate below the latest rollup: only the rollup can bridge the gap now.
    assert consensus.truncate(SHARD, latest) > 0
    fresh = make(consensus, blob, settings)
    assert fresh.fetch() == m.state


class SlowRollupPuts(WrappingStore):
    """Moves a fake clock past half of ``batch_lease`` while a rollup blob is written (a
    writer paused between its PUT and the registering CAS)."""

    def __init__(self, inner: ObjectStore, clock: list[float], pause: float) -> None:
        super().__init__(inner)
        self.clock, self.pause = clock, pause

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        etag = self.inner.put(path, data, mode=mode)
        if "/rollup/" in path:
            self.clock[0] += self.pause
        return etag


def test_a_rollup_too_old_to_register_is_dropped_not_registered(blob: ObjectStore) -> None:
    """GC may delete an unreferenced rollup older than batch_lease: one whose registration
    comes later than half of it must not be named by the head (regression: it was)."""
    settings = PersistSettings(
        rollup_min_bytes=0, rollup_min_diffs=3, batch_lease=10.0, allow_short_leases=True
    )
    clock = [1_000_000.0]
    slow = SlowRollupPuts(blob, clock, pause=settings.batch_lease / 2 + 1)
    with ObjectConsensus(slow, min_age=0) as log:
        m = ShardMachine(SHARD, log, slow, settings, clock=lambda: clock[0], validate=True)
        for i in range(6):
            register(m, f"w{i}")
        assert m.state.rollups == {}
        assert blob.list(f"shards/{SHARD}/rollup/") == []


def test_a_cache_below_the_truncation_point_reloads_from_the_rollup(
    consensus: Consensus, blob: ObjectStore
) -> None:
    settings = PersistSettings(rollup_min_bytes=0, rollup_min_diffs=3)
    lagging = make(consensus, blob, settings)
    assert lagging.state.seqno == 0
    m = make(consensus, blob, settings)
    for i in range(10):
        register(m, f"w{i}")
    consensus.truncate(SHARD, max(m.state.rollups))
    assert lagging.fetch() == m.state


def test_a_load_that_replays_many_diffs_writes_a_rollup(
    consensus: Consensus, blob: ObjectStore
) -> None:
    quiet = PersistSettings(rollup_min_bytes=1 << 30, rollup_replay_limit=3)
    m = make(consensus, blob, quiet)
    for i in range(5):
        register(m, f"w{i}")
    assert not m.state.rollups
    loader = make(consensus, blob, quiet)
    state = loader.fetch()
    assert state.rollups == {5: state.rollups[5]}


def test_a_broken_digest_chain_is_corruption_naming_the_entry(
    consensus: Consensus, blob: ObjectStore
) -> None:
    m = make(consensus, blob)
    register(m, "w1")
    reader = make(consensus, blob)
    reader.fetch()
    # Another writer's entry that was not computed from entry 1 (a resurrection).
    old = m.state
    new = State(shard_id=SHARD, seqno=2, walltime_ms=old.walltime_ms + 1, writers=old.writers)
    forged = StateDiff.between(old, new, nonce="f" * 32, prev_digest=12345)
    consensus.compare_and_set(SHARD, 1, encode_state_diff(forged))
    with pytest.raises(CorruptionError, match="digest chain") as info:
        reader.fetch()
    assert info.value.path == f"consensus/{SHARD}/{2:020}.diff"


def test_a_local_commit_wakes_waiters_at_once(consensus: Consensus, blob: ObjectStore) -> None:
    m = make(consensus, blob)
    seqno = m.state.seqno
    woke: list[float] = []

    def wait() -> None:
        start = time.monotonic()
        m.wait_for_change(seqno, 10.0)
        woke.append(time.monotonic() - start)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.05)
    register(m, "w1")
    thread.join(5.0)
    assert woke and woke[0] < 5.0


def test_a_closed_machine_wakes_waiters_and_refuses_commands(
    consensus: Consensus, blob: ObjectStore
) -> None:
    m = make(consensus, blob)
    m.close()
    assert m.wait_for_change(0, 5.0).seqno == 0
    with pytest.raises(ClosedError):
        register(m, "w1")


def test_a_head_older_than_half_the_min_age_is_read_again_before_a_cas(
    consensus: Consensus, blob: ObjectStore
) -> None:
    calls: list[str] = []
    log = InterceptConsensus(consensus, before=lambda op, key: calls.append(op))
    settings = PersistSettings(consensus_min_age=0.02, batch_lease=10, allow_short_leases=True)
    m = make(log, blob, settings)
    register(m, "w1")
    calls.clear()
    register(m, "w2")
    assert calls == ["compare_and_set"]  # confirmed by its own write just now
    time.sleep(0.03)
    calls.clear()
    register(m, "w3")
    assert calls == ["head", "compare_and_set"]


def test_a_missing_rollup_fails_the_cold_load_after_three_heads(
    consensus: Consensus, blob: ObjectStore
) -> None:
    settings = PersistSettings(rollup_min_bytes=0, rollup_min_diffs=3)
    m = make(consensus, blob, settings)
    for i in range(5):
        register(m, f"w{i}")
    latest = max(m.state.rollups)
    blob.delete(f"shards/{SHARD}/{m.state.rollups[latest].key}")
    heads: list[str] = []
    counted = InterceptConsensus(
        consensus, before=lambda op, key: heads.append(op) if op == "head" else None
    )
    with pytest.raises(CorruptionError, match="missing after 3 tries"):
        make(counted, blob, settings).fetch()
    assert len(heads) == 3


def test_a_catch_up_failing_on_its_second_page_keeps_our_landed_commit(
    consensus: Consensus, blob: ObjectStore
) -> None:
    """Issue 27, defect 4: our CAS lands, its reply is lost, 300 entries of another process
    follow; the catch-up applies the first page (ours in it), then its second page fails.
    The command answers its own success, not ``OpaqueMismatch`` for its own change."""
    other = make(consensus, blob)
    register(other, "w1")
    other.run(
        register_critical_reader, RegisterCriticalReader("c" + "0" * 32), on_uncertain=rerun_as_is
    )
    armed = {"cas": True, "scans": 0}

    def after(op: str, key: str | None) -> None:
        if op == "compare_and_set" and armed["cas"]:
            armed["cas"] = False
            for _ in range(300):  # more than one page (SCAN_LIMIT) after ours
                other.run(heartbeat_writer, HeartbeatWriter("w1"), on_uncertain=rerun_as_is)
            armed["scans"] = 1
            raise StoreUnavailable("reply lost", definite=False)

    def before(op: str, key: str | None) -> None:
        if op == "scan" and armed["scans"]:
            armed["scans"] += 1
            if armed["scans"] == 3:  # the second page of the catch-up
                raise StoreUnavailable("scan failed", definite=True)

    mine = make(InterceptConsensus(consensus, before=before, after=after), blob)
    assert mine.state.seqno == 2
    args = CompareAndDowngradeSince("c" + "0" * 32, b"", b"mine", 7)
    assert mine.run(compare_and_downgrade_since, args) == 7
    assert armed["scans"] >= 3, "the catch-up never reached its second page"
    assert mine.fetch().critical_readers["c" + "0" * 32].opaque == b"mine"
    assert mine.state.seqno >= 303


def test_the_sizes_since_the_latest_rollup_stay_bounded(
    consensus: Consensus, blob: ObjectStore
) -> None:
    """Issue 27, defect 9: with no rollup ever due, the cache kept one size per entry."""
    settings = PersistSettings(rollup_min_bytes=1 << 40)
    m = ShardMachine(SHARD, consensus, blob, settings)
    register(m, "w1")
    for _ in range(1500):
        m.run(heartbeat_writer, HeartbeatWriter("w1"), on_uncertain=rerun_as_is)
    assert len(m._versions._sizes) <= 600
    assert m._versions._sizes.count == 1501 and not m.state.rollups


class ListCounting(WrappingStore):
    """Counts the objects every ``list`` returns (what S3 charges LIST pages for)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.listed = 0
        self.lists = 0

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        found = self.inner.list(prefix, offset=offset)
        self.lists += 1
        self.listed += len(found)
        return found


def test_a_long_catch_up_lists_the_log_a_bounded_number_of_times(blob: ObjectStore) -> None:
    """Issue 27, defect 9: each 256-entry page of a catch-up listed the whole rest of the
    log (quadratic); the next page now reuses the previous page's listing."""
    settings = PersistSettings(rollup_min_bytes=1 << 40)
    with ObjectConsensus(blob, min_age=0) as log:
        writer = ShardMachine(SHARD, log, blob, settings)
        register(writer, "w1")
        counting = ListCounting(blob)
        with ObjectConsensus(counting, min_age=0) as reader_log:
            reader = ShardMachine(SHARD, reader_log, blob, settings)
            assert reader.state.seqno == 1
            for _ in range(2000):
                writer.run(heartbeat_writer, HeartbeatWriter("w1"), on_uncertain=rerun_as_is)
            counting.listed = counting.lists = 0
            assert reader.fetch().seqno == 2001
    # 2,000 entries: the head's LIST (kept for the scans), and one of the last page's rest.
    # Before: the head's, then 2,000 + 1,744 + 1,488 + ...: 10,832 objects in 9 LISTs.
    assert counting.lists <= 3 and counting.listed <= 2000 + 300, (counting.lists, counting.listed)
