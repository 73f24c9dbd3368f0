"""The object-store consensus log beyond the shared conformance suite: requests per operation
(counted by ``MetricsStore``), the truncation age guard (RFC 0015 §3.2 (a)), truncation
interrupted after each DELETE, corrupt and foreign objects, two-phase creates not yet copied,
and every race of its protocol replayed deterministically with paused requests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from slatepy.errors import CorruptionError, InvalidArgument, NotFound, StoreUnavailable
from slatepy.format.checksum import CHECKSUM, checksum
from slatepy.persist.location.consensus import Committed, Mismatch, VersionedData
from slatepy.persist.location.objconsensus import (
    ENTRY_MAGIC,
    ObjectConsensus,
    encode_entry,
    entry_path,
)
from slatepy.store import MetricsStore, ObjectStore, open_store
from slatepy.store.base import ObjectMeta, PutData, PutMode, WrappingStore
from slatepy.store.twophase import TwoPhaseStore
from slatepy.testing.persist_conformance import append
from slatepy.testing.racing import KillableStore, Killed
from tests.conftest import Backend, make_backend

KEY = "orders"
BACKENDS = [
    "memory",
    "file",
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("s3-dynamodb", marks=pytest.mark.s3),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path)


@pytest.fixture
def store() -> ObjectStore:
    return open_store("memory://")


MakeConsensus = Callable[..., ObjectConsensus]


@pytest.fixture
def consensus_on() -> Iterator[MakeConsensus]:
    """``consensus_on(store, **options)``: an ``ObjectConsensus`` (``min_age=0`` unless
    given), closed when the test ends."""
    opened: list[ObjectConsensus] = []

    def make(store: ObjectStore, **options: object) -> ObjectConsensus:
        options.setdefault("min_age", 0)
        consensus = ObjectConsensus(store, **options)  # type: ignore[arg-type]
        opened.append(consensus)
        return consensus

    yield make
    for consensus in opened:
        consensus.close()


class Hooked(WrappingStore):
    """``inner`` with ``before(op, path)`` called before every request: a test pauses an actor
    there (``threading.Event``), lets another act, or fails the request by raising."""

    def __init__(self, inner: ObjectStore, before: Callable[[str, str], None]) -> None:
        super().__init__(inner)
        self.before = before

    def get(self, path: str) -> bytes:
        self.before("get", path)
        return self.inner.get(path)

    def head(self, path: str) -> ObjectMeta:
        self.before("head", path)
        return self.inner.head(path)

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        self.before("put", path)
        return self.inner.put(path, data, mode=mode)

    def delete(self, path: str) -> None:
        self.before("delete", path)
        self.inner.delete(path)

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        self.before("list", prefix)
        return self.inner.list(prefix, offset=offset)


class Stop:
    """Holds the first request matching ``(op, path)`` until released (bounded waits)."""

    def __init__(self, op: str, path: str) -> None:
        self.op, self.path = op, path
        self.reached = threading.Event()
        self.go = threading.Event()

    def __call__(self, op: str, path: str) -> None:
        if op == self.op and path == self.path and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(30), "never released"


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def finish(thread: threading.Thread, out: list[object]) -> object:
    thread.join(30)
    assert not thread.is_alive()
    return out[0]


# Requests per operation.


def test_requests_per_operation(backend: Backend, consensus_on: MakeConsensus) -> None:
    """The table of RFC 0015 §3.2, measured."""
    raw = backend.store()
    metrics = MetricsStore(raw)
    a = consensus_on(metrics)
    other = consensus_on(backend.store())

    def count(fn: Callable[[], object]) -> dict[str, int]:
        metrics.metrics.reset()
        fn()
        return {kind: s.requests for kind, s in metrics.metrics.snapshot().items()}

    assert count(lambda: a.compare_and_set(KEY, None, b"v1")) == {"list": 1, "put": 1}
    assert count(lambda: a.compare_and_set(KEY, 1, b"v2")) == {"put": 1}
    append(other, KEY, b"v3")
    assert count(lambda: a.compare_and_set(KEY, 2, b"lost")) == {"put": 1, "get": 1}
    assert count(lambda: a.head(KEY)) == {"list": 1}  # nothing newer than what it saw
    # Below a seqno it has seen taken: no write, the head is the mismatch.
    assert count(lambda: a.compare_and_set(KEY, 1, b"stale")) == {"list": 1}
    append(other, KEY, b"v4")
    assert count(lambda: a.head(KEY)) == {"list": 1, "get": 1}
    fresh = consensus_on(metrics)
    assert count(lambda: fresh.head(KEY)) == {"list": 1, "get": 1}
    unseen = consensus_on(metrics)
    assert count(lambda: unseen.compare_and_set(KEY, 4, b"v5")) == {"head": 1, "put": 1}
    assert count(lambda: a.scan(KEY, 0, 100)) == {"list": 1, "get": 5}
    assert count(lambda: a.scan(KEY, 4, 1)) == {"list": 1, "get": 1}
    assert count(lambda: a.truncate(KEY, 4)) == {"list": 1, "delete": 3}
    assert count(a.list_keys) == {"list": 1}
    for c in (a, other, fresh, unseen):
        c.close()


# The truncation age guard.


def test_truncate_deletes_only_entries_whose_successor_is_old(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    writer = consensus_on(store)
    for n in range(1, 3):
        append(writer, KEY, b"v%d" % n)
    threading.Event().wait(0.03)  # entries 3 and 4 are visibly younger than 1 and 2
    for n in range(3, 5):
        append(writer, KEY, b"v%d" % n)
    made = {s: m.last_modified for s, m in writer._entries(KEY)}
    assert made[3] - made[2] >= timedelta(seconds=0.02)
    min_age = 600.0
    # A clock at which entry 2 is old enough and entry 3 is not.
    now = (made[2] + timedelta(seconds=min_age + 0.01)).timestamp()
    guarded = consensus_on(store, min_age=min_age, clock=lambda: now)
    # Entry 1's successor (2) is old: deleted. Entry 2's successor (3) is young: kept, and so
    # is everything above it, though entry 3's successor may be old: the log stays contiguous.
    assert guarded.truncate(KEY, 4) == 1
    assert [e.seqno for e in guarded.scan(KEY, 0, 10)] == [2, 3, 4]
    later = (made[4] + timedelta(seconds=min_age + 1)).timestamp()
    aged = consensus_on(store, min_age=min_age, clock=lambda: later)
    assert aged.truncate(KEY, 4) == 2
    assert [e.seqno for e in aged.scan(KEY, 0, 10)] == [4]


def test_the_guard_keeps_the_slot_a_stale_writer_would_recreate(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    """A writer that read head 1 long ago creates entry 2 late. With the default guard
    (1 hour) a truncation keeps entry 2, so the late create is a plain lost race. Without
    it (``min_age=0``) the late create resurrects seqno 2 below the truncation point, and
    a scan reports the gap instead of handing the resurrected entry out as log."""
    stale = consensus_on(store, min_age=0)
    append(stale, KEY, b"v1")  # the stale writers saw head 1
    stale_too = consensus_on(store, min_age=0)
    assert stale_too.head(KEY) == VersionedData(1, b"v1")
    others = consensus_on(store, min_age=3600)
    for n in range(2, 5):
        append(others, KEY, b"v%d" % n)
    assert others.truncate(KEY, 4) == 0
    assert stale.compare_and_set(KEY, 1, b"late") == Mismatch(VersionedData(2, b"v2"))

    unguarded = consensus_on(store, min_age=0)
    assert unguarded.truncate(KEY, 4) == 3
    assert stale_too.compare_and_set(KEY, 1, b"resurrected") == Committed()  # the hole
    with pytest.raises(CorruptionError, match="gap") as raised:
        unguarded.scan(KEY, 0, 10)
    assert raised.value.path == entry_path(KEY, 2)
    assert unguarded.head(KEY) == VersionedData(4, b"v4")  # the head is unaffected
    assert unguarded.scan(KEY, 4, 10) == [VersionedData(4, b"v4")]
    assert unguarded.truncate(KEY, 4) == 1  # a truncation removes it again
    assert unguarded.scan(KEY, 0, 10) == [VersionedData(4, b"v4")]


def test_an_instance_never_recreates_a_seqno_it_has_seen_taken(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    writes: list[str] = []
    counted = Hooked(store, lambda op, path: writes.append(path) if op == "put" else None)
    a = consensus_on(counted)
    for n in range(1, 5):
        append(a, KEY, b"v%d" % n)
    assert consensus_on(store, min_age=0).truncate(KEY, 4) == 3  # seqnos 1-3 are free again
    writes.clear()
    assert a.compare_and_set(KEY, 1, b"stale") == Mismatch(VersionedData(4, b"v4"))
    assert writes == []
    assert consensus_on(store).scan(KEY, 0, 10) == [VersionedData(4, b"v4")]


def test_negative_min_age_is_invalid(store: ObjectStore) -> None:
    with pytest.raises(InvalidArgument, match="min_age"):
        ObjectConsensus(store, min_age=-1)


# Interrupted truncation.


@pytest.mark.parametrize("name", ["memory", pytest.param("s3", marks=pytest.mark.s3)])
def test_truncate_interrupted_after_each_delete_leaves_a_contiguous_suffix(
    name: str, request: pytest.FixtureRequest, tmp_path: Path, consensus_on: MakeConsensus
) -> None:
    backend = make_backend(name, request, tmp_path)
    healthy = consensus_on(backend.store())
    for k in range(5):
        key = f"log-{k}"
        for n in range(1, 7):
            append(healthy, key, b"v%d" % n)
        # Request 1 is the LIST, requests 2.. the DELETEs: die before DELETE number k + 1.
        dying = consensus_on(KillableStore(backend.store(), kill_at=k + 2))
        with pytest.raises(Killed):
            dying.truncate(key, 6)
        assert [e.seqno for e in healthy.scan(key, 0, 10)] == list(range(k + 1, 7))
        assert healthy.head(key) == VersionedData(6, b"v6")
        assert healthy.truncate(key, 6) == 5 - k  # a later truncation finishes the job
        assert [e.seqno for e in healthy.scan(key, 0, 10)] == [6]


# Corrupt and foreign objects.


def test_a_foreign_object_at_an_entry_name_is_named(
    backend: Backend, consensus_on: MakeConsensus
) -> None:
    store = backend.store()
    path = entry_path(KEY, 1)
    store.put(path, b"PAR1 somebody's parquet file")
    consensus = consensus_on(store)
    for call in (lambda: consensus.head(KEY), lambda: consensus.scan(KEY, 0, 10)):
        with pytest.raises(CorruptionError, match="not a slatepy consensus entry") as raised:
            call()
        assert raised.value.path == path
        assert path in str(raised.value)
    # Losing the race to it does not hand it out as an entry either.
    with pytest.raises(CorruptionError) as raised:
        consensus.compare_and_set(KEY, None, b"v1")
    assert raised.value.path == path


def test_every_flipped_byte_is_a_typed_error(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    consensus = consensus_on(store)
    append(consensus, KEY, b"payload")
    path = entry_path(KEY, 1)
    good = store.get(path)
    for i in range(len(good)):
        damaged = bytearray(good)
        damaged[i] ^= 0x40
        store.put(path, bytes(damaged))
        with pytest.raises(CorruptionError) as raised:
            consensus_on(store).head(KEY)
        assert raised.value.path == path
    for cut in (0, 3, 10, len(good) - 1):
        store.put(path, good[:cut])
        with pytest.raises(CorruptionError) as raised:
            consensus_on(store).scan(KEY, 0, 1)
        assert raised.value.path == path


def test_an_entry_copied_to_another_seqno_or_key_is_detected(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    consensus = consensus_on(store)
    append(consensus, KEY, b"v1")
    store.put(entry_path(KEY, 2), store.get(entry_path(KEY, 1)))
    with pytest.raises(CorruptionError, match="copied or moved") as raised:
        consensus_on(store).head(KEY)
    assert raised.value.path == entry_path(KEY, 2)
    store.put(entry_path("other", 1), store.get(entry_path(KEY, 1)))
    with pytest.raises(CorruptionError, match="copied or moved"):
        consensus_on(store).head("other")


def test_an_entry_of_a_newer_format_asks_for_an_upgrade(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    good = encode_entry(KEY, 1, b"v1")
    body = bytearray(good[:-8])
    body[len(ENTRY_MAGIC)] = 2  # the version byte
    store.put(entry_path(KEY, 1), bytes(body) + CHECKSUM.pack(checksum(bytes(body))))
    with pytest.raises(CorruptionError, match="format version 2"):
        consensus_on(store).head(KEY)


def test_objects_that_are_not_entries_are_ignored(
    backend: Backend, consensus_on: MakeConsensus
) -> None:
    store = backend.store()
    consensus = consensus_on(store)
    append(consensus, KEY, b"v1")
    for stray in (
        f"consensus/{KEY}/README",
        f"consensus/{KEY}/{1:020d}.diff.0123abcd.0000000000000000",  # a two-phase temporary
        f"consensus/{KEY}/sub/{2:020d}.diff",
        f"consensus/{KEY}/{2:019d}.diff",
        "consensus/stray",
        f"consensus/only-strays/{3:020d}.txt",
    ):
        store.put(stray, b"not an entry")
    fresh = consensus_on(store)
    assert fresh.head(KEY) == VersionedData(1, b"v1")
    assert fresh.scan(KEY, 0, 10) == [VersionedData(1, b"v1")]
    assert fresh.list_keys() == [KEY]
    assert fresh.compare_and_set(KEY, 1, b"v2") == Committed()


# Uncertain creates, step by step.


def test_a_create_lost_on_the_way_is_created_again(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    calls: list[str] = []

    def before(op: str, path: str) -> None:
        calls.append(op)
        if op == "put" and calls.count("put") == 1:
            raise StoreUnavailable("timed out, never arrived", definite=False)

    consensus = consensus_on(Hooked(store, before))
    assert consensus.compare_and_set(KEY, None, b"v1") == Committed()
    assert calls == ["list", "put", "get", "put"]  # read back: nothing; create again
    assert consensus_on(store).scan(KEY, 0, 10) == [VersionedData(1, b"v1")]


def test_a_create_that_lands_after_its_read_back_is_still_ours(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    puts = 0

    def before(op: str, path: str) -> None:
        nonlocal puts
        if op == "put":
            puts += 1
            if puts == 1:
                raise StoreUnavailable("timed out", definite=False)
            if puts == 2:
                # The first PUT arrives now, after the read-back found nothing.
                store.put(path, encode_entry(KEY, 1, b"v1"), mode="create")

    assert consensus_on(Hooked(store, before)).compare_and_set(KEY, None, b"v1") == Committed()
    assert consensus_on(store).scan(KEY, 0, 10) == [VersionedData(1, b"v1")]


def test_definite_failures_exhaust_the_attempts_and_write_nothing(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    def refuse(op: str, path: str) -> None:
        if op == "put":
            raise StoreUnavailable("refused", definite=True)

    with pytest.raises(StoreUnavailable) as raised:
        consensus_on(Hooked(store, refuse), backoff=0).compare_and_set(KEY, None, b"v1")
    assert raised.value.definite is True
    assert consensus_on(store).head(KEY) is None

    puts = 0

    def timeout_then_refuse(op: str, path: str) -> None:
        nonlocal puts
        if op == "put":
            puts += 1
            raise StoreUnavailable("lost", definite=puts > 1)

    with pytest.raises(StoreUnavailable) as raised:
        consensus_on(Hooked(store, timeout_then_refuse), backoff=0).compare_and_set(
            KEY, None, b"v1"
        )
    assert raised.value.definite is False  # the first PUT may still land


def test_a_lost_race_whose_winner_is_truncated_before_the_read_is_a_mismatch(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    other = consensus_on(store)
    append(other, KEY, b"v1")

    def before(op: str, path: str) -> None:
        if op == "put" and path == entry_path(KEY, 2):
            append(other, KEY, b"theirs")  # takes seqno 2 first
        if op == "get" and path == entry_path(KEY, 2):
            append(other, KEY, b"v3")
            other.truncate(KEY, 3)  # ... and it is truncated before we read it

    consensus = consensus_on(Hooked(store, before))
    assert consensus.head(KEY) == VersionedData(1, b"v1")
    assert consensus.compare_and_set(KEY, 1, b"ours") == Mismatch(VersionedData(3, b"v3"))


def test_an_uncertain_create_whose_slot_is_truncated_is_indefinite(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    other = consensus_on(store)
    append(other, KEY, b"v1")
    puts = gets = 0

    def before(op: str, path: str) -> None:
        nonlocal puts, gets
        if op == "put":
            puts += 1
            if puts == 1:
                raise StoreUnavailable("timed out", definite=False)  # might land any time
            append(other, KEY, b"theirs")  # the slot is taken before our second try
        if op == "get" and path == entry_path(KEY, 2):
            gets += 1
            if gets == 2:  # 1: the read-back (nothing); 2: reading the winner, gone by now
                append(other, KEY, b"v3")
                other.truncate(KEY, 3)

    consensus = consensus_on(Hooked(store, before))
    consensus.head(KEY)
    with pytest.raises(StoreUnavailable, match="truncated") as raised:
        consensus.compare_and_set(KEY, 1, b"ours")
    assert raised.value.definite is False


# Races, paused at the exact request.


def test_two_writers_paused_before_creating_the_same_seqno(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    stop_a, stop_b = Stop("put", entry_path(KEY, 2)), Stop("put", entry_path(KEY, 2))
    a, b = consensus_on(Hooked(store, stop_a)), consensus_on(Hooked(store, stop_b))
    append(a, KEY, b"v1")
    assert b.head(KEY) == VersionedData(1, b"v1")
    ta, out_a = in_thread(lambda: a.compare_and_set(KEY, 1, b"from a"))
    tb, out_b = in_thread(lambda: b.compare_and_set(KEY, 1, b"from b"))
    assert stop_a.reached.wait(30) and stop_b.reached.wait(30)  # both decided to write 2
    stop_b.go.set()
    assert finish(tb, out_b) == Committed()
    stop_a.go.set()
    assert finish(ta, out_a) == Mismatch(VersionedData(2, b"from b"))
    assert consensus_on(store).scan(KEY, 0, 10) == [
        VersionedData(1, b"v1"),
        VersionedData(2, b"from b"),
    ]


def test_head_whose_newest_entry_is_truncated_before_the_read_lists_again(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    other = consensus_on(store)
    append(other, KEY, b"v1")
    append(other, KEY, b"v2")
    stop = Stop("get", entry_path(KEY, 2))
    reader = consensus_on(Hooked(store, stop))
    thread, out = in_thread(lambda: reader.head(KEY))
    assert stop.reached.wait(30)  # listed [1, 2], about to read 2
    append(other, KEY, b"v3")
    assert other.truncate(KEY, 3) == 2
    stop.go.set()
    assert finish(thread, out) == VersionedData(3, b"v3")


def test_scan_racing_a_truncation_returns_what_remains(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    other = consensus_on(store)
    for n in range(1, 5):
        append(other, KEY, b"v%d" % n)
    stop = Stop("get", entry_path(KEY, 1))
    reader = consensus_on(Hooked(store, stop))
    thread, out = in_thread(lambda: reader.scan(KEY, 0, 10))
    assert stop.reached.wait(30)
    assert other.truncate(KEY, 3) == 2
    stop.go.set()
    assert finish(thread, out) == [VersionedData(3, b"v3"), VersionedData(4, b"v4")]


class TornListing(WrappingStore):
    """A LIST that misses entry 3 the way a directory scan (in directory order) or S3's
    pages can: racing a truncation (it read entry 2's name, then 1 to 3 were deleted), or
    racing the creates of 3 and 4 (it passed 3's place before 3 existed)."""

    def __init__(self, inner: ObjectStore, *, truncate: bool) -> None:
        super().__init__(inner)
        self.armed = True
        self.truncate = truncate

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        found = self.inner.list(prefix, offset=offset)
        if not self.armed or not prefix.startswith("consensus/"):
            return found
        self.armed = False
        if self.truncate:
            for seqno in (1, 2, 3):  # the truncation, ascending
                self.inner.delete(entry_path(KEY, seqno))
        return [meta for meta in found if meta.path != entry_path(KEY, 3)]


@pytest.mark.parametrize("truncate", [True, False], ids=["truncation", "creates"])
def test_a_torn_listing_is_listed_again_not_corruption(
    store: ObjectStore, consensus_on: MakeConsensus, truncate: bool
) -> None:
    """Found by the linearizability test (issue 27): such a listing showed a gap (2, then
    4) and the scan raised ``CorruptionError``. A gap is real only when a second listing
    shows it too, with its lower entry still there."""
    other = consensus_on(store)
    for n in range(1, 7):
        append(other, KEY, b"v%d" % n)
    reader = consensus_on(TornListing(store, truncate=truncate))
    expected = [4, 5, 6] if truncate else [2, 3, 4, 5, 6]
    assert [e.seqno for e in reader.scan(KEY, 2, 10)] == expected


def test_cas_paused_while_a_truncation_runs_still_commits(
    store: ObjectStore, consensus_on: MakeConsensus
) -> None:
    other = consensus_on(store)
    for n in range(1, 4):
        append(other, KEY, b"v%d" % n)
    stop = Stop("put", entry_path(KEY, 4))
    writer = consensus_on(Hooked(store, stop))
    assert writer.head(KEY) == VersionedData(3, b"v3")
    thread, out = in_thread(lambda: writer.compare_and_set(KEY, 3, b"v4"))
    assert stop.reached.wait(30)
    assert other.truncate(KEY, 3) == 2  # the head (3) stays: the CAS still builds on it
    stop.go.set()
    assert finish(thread, out) == Committed()
    assert [e.seqno for e in other.scan(KEY, 0, 10)] == [3, 4]


# The two-phase CAS: a claimed create not yet copied.


class Crash(BaseException):
    """The creating process dies (nothing in slatepy catches a BaseException)."""


@pytest.mark.s3
def test_a_two_phase_create_claimed_but_not_copied_is_the_head(
    request: pytest.FixtureRequest, tmp_path: Path, consensus_on: MakeConsensus
) -> None:
    backend = make_backend("s3-dynamodb", request, tmp_path)
    base = backend.store()
    assert isinstance(base, TwoPhaseStore)

    def die_after_claim(step: int, destination: str) -> None:
        if step == 2:
            raise Crash(destination)

    crashing = TwoPhaseStore(base.inner, base.records, background=False, after_step=die_after_claim)
    append(consensus_on(base), KEY, b"v1")
    with pytest.raises(Crash):
        consensus_on(crashing).compare_and_set(KEY, 1, b"claimed")
    with pytest.raises(NotFound):
        base.inner.get(entry_path(KEY, 2))  # durable in DynamoDB only
    survivor = consensus_on(backend.store())
    assert survivor.head(KEY) == VersionedData(2, b"claimed")  # the LIST completes it
    assert survivor.compare_and_set(KEY, 1, b"late") == Mismatch(VersionedData(2, b"claimed"))


# Life cycle.


def test_close_stops_the_read_threads(store: ObjectStore, consensus_on: MakeConsensus) -> None:
    consensus = consensus_on(store)
    for n in range(1, 6):
        append(consensus, KEY, b"v%d" % n)
    assert len(consensus.scan(KEY, 0, 10)) == 5
    assert any(t.name.startswith("slatepy-consensus-read") for t in threading.enumerate())
    consensus.close()
    assert not any(t.name.startswith("slatepy-consensus-read") for t in threading.enumerate())
