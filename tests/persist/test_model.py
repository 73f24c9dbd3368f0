"""The real client stack against a multiset model, under faults (RFC 0015 §13.4).

A hypothesis ``RuleBasedStateMachine`` drives one shard through a ``PersistClient`` on a
shared memory store, with a ``FaultyStore`` beneath the retrying stack (blob parts, rollups and
the object-store consensus log all travel through it) and a ``FaultyConsensus`` on the log:
``compare_and_append``, ``append`` (retried, as it is retry-safe), batches applied with
``compare_and_append_batch`` (some shipped through ``to_bytes``/``batch_from_bytes``, some
applied twice for disjoint ranges, some too old), leased and critical since downgrades,
listens, snapshots, merges and GC passes run explicitly, crashes of handles and of the whole
client (dropped without closing; a new client opens on the same store), expiry, and the clock
moving on. The model is the multiset ``(k, v, t) -> diff`` with the upper.

Invariants: a snapshot at any readable ``as_of`` equals the model consolidated at ``as_of``;
a listen delivers every update after its ``as_of`` once, nothing at or before it, uppers
strictly increasing, and what it delivered always equals the model between its ``as_of`` and
its frontier; the shard's upper and since and every handle's since never regress. A write
that failed definitely changed nothing; one that failed indefinitely is resolved by reading
the shard (faults off for the read) and the model follows what landed.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from slatepy.config import Settings
from slatepy.errors import StoreUnavailable
from slatepy.persist import (
    Batch,
    Listen,
    OpaqueMismatch,
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
from slatepy.persist.codec import Update
from slatepy.persist.compactor import compact
from slatepy.persist.consolidation import consolidate
from slatepy.persist.gc import collect
from slatepy.persist.location.open import open_consensus
from slatepy.persist.state.records import State
from slatepy.store import open_store
from slatepy.store.base import ObjectMeta, ObjectStore, PutData, PutMode, WrappingStore
from slatepy.store.stack import open_stack
from slatepy.testing.faults import FaultyStore, uniform
from slatepy.testing.persist_faults import FaultyConsensus, consensus_uniform
from tests.persist.compaction_kit import claims, manual
from tests.persist.handles_kit import Clock

T = TypeVar("T")

SHARD = "model"
RATES = (0.0, 0.10, 0.25)
TRIES = 30
"""Attempts of a call the model retries (reads, idempotent downgrades, ``append``)."""

MODEL_SETTINGS = PersistSettings(
    reader_lease=60.0,
    writer_lease=60.0,
    batch_lease=20.0,
    merge_lease=10.0,
    consensus_min_age=1.0,
    allow_short_leases=True,
    inline_part_max_bytes=40,  # an update or two inline, more as blob parts
    rollup_min_bytes=0,
    rollup_min_diffs=4,  # rollups (and cold loads from them) happen within an example
    small_merge_batches=2,  # merges within an example (the default waits for 8 batches)
)
STORE_SETTINGS = Settings(request_attempts=2)  # faults reach persist, not only the retries
CLOCK_STEP = 3.0  # never lands a batch's age on batch_lease / 2 (10 s) exactly
LAPSE = 100.0  # past every lease

KEYS = st.sampled_from([b"a", b"b", b"c", b"d\x00", b"e"])
VALUES = st.sampled_from([b"", b"v", b"x" * 40])
DIFFS = st.sampled_from([-2, -1, 1, 1, 2])
Pre = tuple[bytes, bytes, int, int]  # key, value, time offset, diff
PRE = st.tuples(KEYS, VALUES, st.integers(0, 3), DIFFS)
PRES = st.lists(PRE, max_size=8)


STATS: Counter[str] = Counter()
"""What the examples exercised (reset per test), to check that the checks had something
to check."""


class ClockedStore(WrappingStore):
    """The shared "bucket": objects are stamped with the test's clock, not the real one.

    GC compares ``last_modified`` with the client's clock (it assumes they agree within
    ``batch_lease / 2``); a test that moves the client's clock by hand must move the
    store's with it, or young parts would look old and be collected."""

    def __init__(self, inner: ObjectStore, clock: Clock) -> None:
        super().__init__(inner)
        self.clock = clock
        self._written: dict[str, float] = {}
        self._lock = threading.Lock()

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        result = self.inner.put(path, data, mode=mode)
        with self._lock:
            self._written[path] = self.clock.now
        return result

    def _stamped(self, meta: ObjectMeta) -> ObjectMeta:
        with self._lock:
            written = self._written.get(meta.path)
        if written is None:
            return meta
        return dataclasses.replace(meta, last_modified=datetime.fromtimestamp(written, tz=UTC))

    def head(self, path: str) -> ObjectMeta:
        return self._stamped(self.inner.head(path))

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        return [self._stamped(meta) for meta in self.inner.list(prefix, offset=offset)]


class Retried(Exception):
    """A call the model retries kept failing: the fault rate is too high for the test."""


def retried(call: Callable[[], T]) -> T:
    """``call()``, again while the store or consensus is unavailable (idempotent calls)."""
    for _ in range(TRIES - 1):
        try:
            return call()
        except StoreUnavailable:
            continue
    try:
        return call()
    except StoreUnavailable as exc:
        raise Retried(f"{TRIES} attempts failed: {exc}") from exc


def at_times(pres: list[Pre], lower: int, upper: int) -> list[Update]:
    """The drawn updates with times spread over ``[lower, upper)``."""
    return [((k, v), lower + off % (upper - lower), d) for k, v, off, d in pres]


@dataclass
class Reader:
    """A leased reader the model holds, with its open listen (if any)."""

    handle: ReadHandle
    since: int  # the since the handle answered last (it may only grow)
    listen: Listen | None = None
    as_of: int = 0
    delivered: Counter[tuple[bytes, bytes, int]] = field(default_factory=Counter)
    last_progress: int | None = None


@dataclass
class Pending:
    """A batch written and not applied (yet): the object, or its shipped bytes."""

    batch: Batch | None
    data: bytes | None
    lower: int
    upper: int
    updates: list[Update]
    written: float  # the model clock when written


class ShardModel(RuleBasedStateMachine):
    """One shard, the real stack, a multiset model (see the module docstring)."""

    rate = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock(time.time())
        self.raw = ClockedStore(open_store("memory://"), self.clock)  # outlives every client
        self.generation = 0
        self.clients: list[PersistClient] = []
        self.faulty_stores: list[FaultyStore] = []
        self.faulty_logs: list[FaultyConsensus] = []
        self.model: Counter[tuple[bytes, bytes, int]] = Counter()
        self.upper = 0
        self.since_seen = 0  # the shard's since, as last read
        self.readers: list[Reader] = []
        self.pending: list[Pending] = []
        self.critical: SinceHandle | None = None
        self.critical_opaque = b""
        self.critical_since: int | None = None  # None: not registered yet
        self.client = self._open_client()
        self.writer = self._open_writer()

    # -- plumbing ---------------------------------------------------------------------------

    def _open_client(self) -> PersistClient:
        self.generation += 1
        seed = self.generation
        faulty = FaultyStore(self.raw, rates=uniform(self.rate), seed=seed)
        stack = open_stack(faulty, STORE_SETTINGS)
        log = open_consensus(stack, min_age=MODEL_SETTINGS.consensus_min_age, clock=self.clock)
        faulty_log = FaultyConsensus(log, rates=consensus_uniform(self.rate), seed=1000 + seed)
        client = PersistClient.open(
            stack,
            consensus=faulty_log,
            settings=STORE_SETTINGS,
            persist_settings=MODEL_SETTINGS,
            clock=self.clock,
        )
        manual(client)  # merges and GC run only when a rule says so
        self.clients.append(client)
        self.faulty_stores.append(faulty)
        self.faulty_logs.append(faulty_log)
        return client

    def _faults(self, enabled: bool) -> None:
        injectors: list[FaultyStore | FaultyConsensus] = [*self.faulty_stores, *self.faulty_logs]
        for injector in injectors:
            if not enabled and injector.enabled:
                STATS["faults injected"] += sum(injector.counts.values())
                injector.counts.clear()
            injector.enabled = enabled and self.rate > 0

    def _verified(self, call: Callable[[], T]) -> T:
        """``call()`` with faults off: how the model looks at the shard to decide."""
        self._faults(False)
        try:
            return call()
        finally:
            self._faults(True)

    def _state(self) -> State:
        return self._verified(lambda: self.client.machine(SHARD).fetch())

    def _open_writer(self) -> WriteHandle:
        return retried(lambda: self.client.open_writer(SHARD))

    def _expected_snapshot(self, as_of: int) -> list[Update]:
        return consolidate(
            ((k, v), as_of, d) for (k, v, t), d in self.model.items() if t <= as_of and d
        )

    def _add(self, updates: list[Update], lower: int, upper: int) -> None:
        for (k, v), t, d in updates:
            if lower <= t < upper:
                self.model[(k, v, t)] += d
        self.upper = upper

    def _lapsed(self, deadline_ms: int) -> bool:
        return deadline_ms < int(self.clock.now * 1000)

    def _lease_lapsed(self, exc: UsageError) -> bool:
        return "lease expired" in str(exc) or "not registered" in str(exc)

    def _replace_writer(self) -> None:
        self.writer = self._open_writer()

    def _resolve(self, exc: StoreUnavailable, expected: int, new: int) -> bool:
        """Whether an append from ``expected`` to ``new`` that raised ``exc`` landed."""
        upper = self._state().upper
        STATS[
            f"{'definite' if exc.definite else 'indefinite'} failures, landed={upper == new}"
        ] += 1
        if exc.definite:
            assert upper == expected, f"a definite failure moved the upper to {upper}: {exc}"
            return False
        assert upper in (expected, new), f"upper {upper}: neither {expected} nor {new}"
        return upper == new

    @initialize()
    def a_reader_listening_from_the_start(self) -> None:
        self.open_reader()
        for reader in self.readers:
            self._start_listen(reader, 0)

    # -- writes -----------------------------------------------------------------------------

    @rule(pres=PRES, width=st.integers(1, 3), off_by=st.sampled_from([0, 0, 0, 0, -1, 1]))
    def compare_and_append(self, pres: list[Pre], width: int, off_by: int) -> None:
        STATS["compare_and_append"] += 1
        expected = self.upper + off_by
        if expected < 0:
            return
        new = expected + width
        updates = at_times(pres, expected, new)
        try:
            self.writer.compare_and_append(updates, expected, new)
        except UpperMismatch as exc:
            assert off_by != 0, f"the model's upper {self.upper} is the shard's: {exc}"
            assert (exc.expected, exc.current) == (expected, self.upper)
            assert self._state().upper == self.upper
            return
        except UsageError as exc:
            assert self._lease_lapsed(exc), exc
            assert self._state().upper == self.upper
            self._replace_writer()
            return
        except StoreUnavailable as exc:
            if off_by == 0 and self._resolve(exc, expected, new):
                self._add(updates, expected, new)
            elif off_by:
                assert self._state().upper == self.upper
            return
        assert off_by == 0, f"appended at {expected} while the upper was {self.upper}"
        self._add(updates, expected, new)
        assert self.writer.upper == new

    @rule(pres=PRES, back=st.integers(0, 2), width=st.integers(1, 4))
    def append(self, pres: list[Pre], back: int, width: int) -> None:
        """``append`` is retry-safe and may overlap what is there: the model keeps the
        updates at or after the upper it met, whatever attempt landed them."""
        STATS["append"] += 1
        lower = max(0, self.upper - back)
        new = lower + width
        updates = at_times(pres, lower, new)
        before = self.upper
        for _ in range(TRIES):
            try:
                self.writer.append(updates, lower, new)
                break
            except StoreUnavailable:
                continue
            except UsageError as exc:
                assert self._lease_lapsed(exc), exc
                self._replace_writer()
        else:
            if self._state().upper == before:
                return
        if new > before:
            self._add(updates, before, new)
        assert self._state().upper == max(before, new)

    @rule(pres=PRES, width=st.integers(1, 4), ship=st.booleans())
    def write_batch(self, pres: list[Pre], width: int, ship: bool) -> None:
        lower = self.upper
        new = lower + width
        updates = at_times(pres, lower, new)
        try:
            batch = self.writer.batch(updates, lower, new)
        except StoreUnavailable:
            return  # parts may have leaked: GC's business
        data = batch.to_bytes() if ship else None
        self.pending.append(
            Pending(None if ship else batch, data, lower, new, updates, self.clock.now)
        )

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), whole=st.booleans())
    def compare_and_append_batch(self, data: st.DataObject, whole: bool) -> None:
        pending = data.draw(st.sampled_from(self.pending))
        expected = self.upper
        if pending.upper <= expected:
            self.pending.remove(pending)  # covers nothing new any more
            return
        new = pending.upper if whole else data.draw(st.integers(expected + 1, pending.upper))
        if pending.batch is None:
            assert pending.data is not None
            try:
                pending.batch = self.writer.batch_from_bytes(pending.data)
            except UsageError as exc:
                raise AssertionError(f"a shipped batch was refused: {exc}") from exc
        too_old = self.clock.now - pending.written > MODEL_SETTINGS.batch_lease / 2
        try:
            self.writer.compare_and_append_batch([pending.batch], expected, new)
        except UsageError as exc:
            if self._lease_lapsed(exc):
                self._replace_writer()
            else:
                assert too_old and "too old" in str(exc), exc
                STATS["batches too old"] += 1
                self.pending.remove(pending)
            assert self._state().upper == expected
            return
        except StoreUnavailable as exc:
            if self._resolve(exc, expected, new):
                self._add(pending.updates, expected, new)
            return
        assert not too_old, "a batch older than batch_lease / 2 was applied"
        STATS["batches applied " + ("shipped" if pending.data else "local")] += 1
        self._add(pending.updates, expected, new)

    # -- readers ----------------------------------------------------------------------------

    @precondition(lambda self: len(self.readers) < 3)
    @rule()
    def open_reader(self) -> None:
        try:
            handle = self.client.open_leased_reader(SHARD)
        except StoreUnavailable:
            return  # maybe registered: a reader nobody holds, until its lease lapses
        since = handle.since
        assert since is not None and since >= self.since_seen
        self.readers.append(Reader(handle, since))

    def _reader_lost(self, reader: Reader, exc: UsageError) -> None:
        assert self._lease_lapsed(exc), exc
        self.readers.remove(reader)

    @precondition(lambda self: self.readers)
    @rule(data=st.data(), ahead=st.integers(0, 3))
    def downgrade_since(self, data: st.DataObject, ahead: int) -> None:
        reader = data.draw(st.sampled_from(self.readers))
        target = reader.since + ahead
        try:
            since = retried(lambda: reader.handle.downgrade_since(target))
        except UsageError as exc:
            self._reader_lost(reader, exc)
            return
        assert since is not None and since >= reader.since, "a reader's since regressed"
        if reader.listen is None:
            assert since == max(reader.since, target)
        reader.since = since

    @precondition(lambda self: self.readers)
    @rule(data=st.data(), back=st.integers(0, 3), lazily=st.booleans())
    def snapshot(self, data: st.DataObject, back: int, lazily: bool) -> None:
        reader = data.draw(st.sampled_from(self.readers))
        if reader.since > 0:
            with pytest.raises(SinceError):  # at the call, before any request
                reader.handle.snapshot(reader.since - 1, timeout=5.0)
        if self.upper <= reader.since:
            return  # nothing readable yet (a read would wait for the upper)
        as_of = max(reader.since, self.upper - 1 - back)

        def read() -> list[Update]:
            if lazily:
                return list(reader.handle.snapshot_iter(as_of, timeout=5.0))
            return reader.handle.snapshot(as_of, timeout=5.0)

        try:
            got = retried(read)
        except UsageError as exc:
            assert not isinstance(exc, SinceError), exc
            self._reader_lost(reader, exc)
            return
        assert got == self._expected_snapshot(as_of), f"snapshot at {as_of}"
        STATS["snapshot rows" if got else "empty snapshots"] += len(got) or 1

    @precondition(lambda self: any(r.listen is None for r in self.readers))
    @rule(data=st.data(), back=st.integers(0, 2))
    def listen(self, data: st.DataObject, back: int) -> None:
        reader = data.draw(st.sampled_from([r for r in self.readers if r.listen is None]))
        self._start_listen(reader, max(reader.since, self.upper - 1 - back))

    def _start_listen(self, reader: Reader, as_of: int) -> None:
        reader.listen = reader.handle.listen(as_of)
        reader.as_of = as_of
        reader.delivered = Counter()
        reader.last_progress = as_of  # the first Progress may be as_of + 1 (issue 27)

    def _check_events(self, reader: Reader, events: list[Updates | Progress]) -> None:
        pending: list[Update] = []
        for event in events:
            if isinstance(event, Updates):
                pending.extend(event.updates)
                continue
            upper = event.upper
            assert upper is not None and reader.last_progress is not None
            assert upper > reader.last_progress, f"progress {upper} after {reader.last_progress}"
            for (k, v), t, d in pending:
                assert reader.as_of < t and reader.last_progress <= t < upper, (
                    f"time {t} outside its progress"
                )
                reader.delivered[(k, v, t)] += d
            STATS["listen updates"] += len(pending)
            pending = []
            reader.last_progress = upper
        assert not pending, "updates without a progress after them"
        low, high = reader.as_of, reader.last_progress
        assert high is not None
        expected = consolidate(
            ((k, v), t, d) for (k, v, t), d in self.model.items() if low < t < high
        )
        got = consolidate(((k, v), t, d) for (k, v, t), d in reader.delivered.items())
        assert got == expected, f"listen from {low}: delivered up to {high} differs"

    @precondition(lambda self: any(r.listen is not None for r in self.readers))
    @rule(data=st.data())
    def close_listen(self, data: st.DataObject) -> None:
        reader = data.draw(st.sampled_from([r for r in self.readers if r.listen is not None]))
        assert reader.listen is not None
        reader.listen.close()
        reader.listen = None

    @precondition(lambda self: self.readers)
    @rule(data=st.data(), crash=st.booleans())
    def drop_reader(self, data: st.DataObject, crash: bool) -> None:
        """Expire a reader, or drop it as a crashed process would (its lease stays)."""
        reader = data.draw(st.sampled_from(self.readers))
        self.readers.remove(reader)
        if crash:
            return
        try:
            retried(reader.handle.expire)
        except UsageError as exc:
            assert self._lease_lapsed(exc), exc
        state = self._state()
        entry = state.leased_readers.get(reader.handle.reader_id)
        # Gone, or lapsed already (dropped by the next change that commits).
        assert entry is None or self._lapsed(entry.last_heartbeat_ms + entry.lease_ms)

    # -- the critical since -----------------------------------------------------------------

    @rule(ahead=st.integers(0, 3), wrong=st.booleans())
    def critical_downgrade(self, ahead: int, wrong: bool) -> None:
        if self.critical is None:
            self.critical = retried(lambda: self.client.open_critical_since(SHARD, "controller"))
            assert self.critical.opaque == self.critical_opaque
            if self.critical_since is None:  # registered at the shard's since
                assert frontier.le(self.since_seen, self.critical.since)
                assert self.critical.since is not None
                self.critical_since = self.critical.since
            assert self.critical.since == self.critical_since
        handle = self.critical
        assert self.critical_since is not None
        expected = self.critical_opaque + (b"?" if wrong else b"")
        new_opaque = b"epoch%d" % (len(self.critical_opaque) + 1)
        target = self.critical_since + ahead
        try:
            since = handle.compare_and_downgrade_since(expected, new_opaque, target)
        except OpaqueMismatch as exc:
            assert wrong and exc.current == self.critical_opaque
            return
        except StoreUnavailable as exc:
            # No token: the stored opaque tells whether it landed.
            hold = self._state().critical_readers["controller"]
            if wrong or exc.definite:
                assert hold.opaque == self.critical_opaque
            else:
                assert hold.opaque in (self.critical_opaque, new_opaque)
            assert hold.since is not None and hold.since >= self.critical_since
            self.critical_opaque, self.critical_since = hold.opaque, hold.since
            self.critical = None  # reopen: this handle's cached opaque may be stale
            return
        assert not wrong, "a wrong opaque was accepted"
        assert since == max(self.critical_since, target)
        self.critical_opaque, self.critical_since = new_opaque, since

    # -- maintenance, crashes, time ---------------------------------------------------------

    @rule(kind=st.sampled_from(["compact", "gc"]))
    def maintenance(self, kind: str) -> None:
        """A merge pass or a GC pass, run here rather than in the background."""
        if kind == "compact":
            self._compact()
        else:
            self._gc()

    def _compact(self) -> None:
        """Run every merge claimed in the state (by any writer, dead ones too)."""
        machine = self.client.machine(SHARD)
        state = self._state()
        for claimant in sorted({claim.claimant for claim in state.merges.values()}):
            for request in claims(state, claimant):
                try:
                    STATS[
                        "merge " + compact(machine, self.client._tables, claimant, request).status
                    ] += 1
                except StoreUnavailable:
                    STATS["merge failed"] += 1

    def _gc(self) -> None:
        try:
            report = collect(self.client.machine(SHARD), claimant="gc")
        except StoreUnavailable:
            STATS["gc failed"] += 1
            return
        STATS["gc " + report.status] += 1
        STATS["gc deleted parts"] += len(report.parts)
        STATS["gc deleted rollups"] += len(report.rollups)
        STATS["gc truncated"] += report.truncated_to is not None

    @rule(kind=st.sampled_from(["writer", "expire writer", "client"]))
    def crash(self, kind: str) -> None:
        if kind == "writer":
            self._reopen_writer()
        elif kind == "expire writer":
            self._expire_writer()
        else:
            self._crash_client()

    def _reopen_writer(self) -> None:
        """Drop the writer without expiring it (a crashed process) and open another."""
        self._replace_writer()

    def _expire_writer(self) -> None:
        writer_id = self.writer.writer_id
        try:
            retried(self.writer.expire)
        except UsageError as exc:
            assert self._lease_lapsed(exc), exc
        entry = self._state().writers.get(writer_id)
        assert entry is None or self._lapsed(entry.last_heartbeat_ms + entry.lease_ms)
        self._replace_writer()

    def _crash_client(self) -> None:
        """Drop the client and its handles without closing anything; open a new one on the
        same store. Batches survive only as shipped bytes."""
        for pending in self.pending:
            if pending.batch is not None:
                pending.data, pending.batch = pending.batch.to_bytes(), None
        self.readers = []
        self.critical = None
        self.client = self._open_client()
        self.writer = self._open_writer()

    @rule(seconds=st.sampled_from([CLOCK_STEP, CLOCK_STEP, 4 * CLOCK_STEP, LAPSE]))
    def advance_clock(self, seconds: float) -> None:
        """Time passes; ``LAPSE`` runs out every lease (the next change drops the readers
        and writers)."""
        self.clock.advance(seconds)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def frontiers_never_regress(self) -> None:
        STATS["steps"] += 1
        state = self._state()
        assert state.upper == self.upper, f"upper {state.upper}, model {self.upper}"
        assert state.since is not None and state.since >= self.since_seen, "since regressed"
        self.since_seen = state.since
        # A reader whose lease lapsed is gone from the state (its calls raise UsageError).
        self.readers = [r for r in self.readers if r.handle.reader_id in state.leased_readers]
        for reader in self.readers:
            since = reader.handle.since  # a listen's progress may push it on
            assert since is not None and since >= reader.since, "a reader's since regressed"
            assert state.since <= since, "the shard's since is beyond a reader's"
            reader.since = since

    @invariant()
    def reads_match_the_model(self) -> None:
        """The oldest reader reads at the upper - 1 and every listen takes what is new."""
        if self.readers and self.upper > self.readers[0].since:
            reader = self.readers[0]
            as_of = self.upper - 1
            try:
                got = retried(lambda: reader.handle.snapshot(as_of, timeout=5.0))
            except UsageError as exc:
                assert not isinstance(exc, SinceError), exc
                self._reader_lost(reader, exc)
                return
            assert got == self._expected_snapshot(as_of), f"snapshot at {as_of}"
            STATS["snapshot rows" if got else "empty snapshots"] += len(got) or 1
        for reader in list(self.readers):
            listen = reader.listen
            if listen is None:
                continue
            try:
                events = retried(functools.partial(listen.fetch_next, timeout=0.0))
            except UsageError as exc:
                self._reader_lost(reader, exc)
                continue
            self._check_events(reader, events)

    def teardown(self) -> None:
        try:
            if self.readers or self.upper:
                self._final_check()
        finally:
            self._faults(False)
            for client in self.clients:
                client.close()
            for log in self.faulty_logs:  # passed in, so not the clients' to close
                log.close()

    def _final_check(self) -> None:
        """With faults off: a new reader sees the model, and every listen catches up."""
        self._faults(False)
        upper = self.upper
        if upper == 0:
            return
        reader = self.client.open_leased_reader(SHARD)
        as_of = max(upper - 1, reader.since or 0)
        if as_of < upper:
            assert reader.snapshot(as_of) == self._expected_snapshot(as_of)
        for held in self.readers:
            if held.listen is None:
                continue
            try:
                while frontier.lt(held.last_progress, upper):
                    events = held.listen.fetch_next(timeout=5.0)
                    assert events, "a listen did not catch up with the upper"
                    self._check_events(held, events)
            except UsageError as exc:
                assert self._lease_lapsed(exc), exc


HYPOTHESIS = settings(
    max_examples=20,
    stateful_step_count=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.parametrize("rate", RATES, ids=[f"faults{int(r * 100)}" for r in RATES])
def test_the_client_stack_matches_a_multiset_model(rate: float) -> None:
    class AtRate(ShardModel):
        pass

    AtRate.rate = rate
    STATS.clear()
    run_state_machine_as_test(AtRate, settings=HYPOTHESIS)
    print(f"faults {rate:.0%}:", dict(sorted(STATS.items())))
    # The checks had something to check.
    assert STATS["steps"] >= 400 and STATS["snapshot rows"] >= 100
    assert STATS["listen updates"] > 0 and STATS["merge applied"] > 0
    assert (STATS["faults injected"] > 100) is (rate > 0)
