"""The ``Consensus`` conformance suite: what every implementation must do, as pytest tests
(RFC 0015 §13.2; the contract is in :mod:`slatepy.persist.location.consensus`).

Use it like :class:`slatepy.testing.conformance.StoreConformance`: subclass
:class:`ConsensusConformance` and provide ``open_consensus``, a factory of instances on one
fresh, empty location (several instances stand for several processes); optionally
``faulty``, a consensus with a :class:`~slatepy.testing.persist_faults.WriteFaults` beneath
it, for the read-back tests (they skip while it returns ``None``)::

    class TestMine(ConsensusConformance):
        @pytest.fixture
        def open_consensus(self) -> Iterator[Opener]:
            store = open_store("memory://")
            with Opener(lambda: ObjectConsensus(store, min_age=0)) as opener:
                yield opener
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

import pytest

from slatepy.errors import ClosedError, InvalidArgument, StoreUnavailable
from slatepy.persist.location.consensus import (
    SEQNO_MAX,
    Committed,
    Consensus,
    Mismatch,
    VersionedData,
)
from slatepy.testing.persist_faults import WriteFaults

C = TypeVar("C", bound=Consensus)
KEY = "shard-a"
RACE_THREADS = 8
RACE_ROUNDS = 8
"""Rounds of the lock-step race: each is an 8-way collision on one seqno."""
RACE_ENTRIES = 12
"""Entries the free-running racers append between them."""
RACE_ATTEMPTS = 200
"""Iterations one racing thread may make (each is a head and a CAS)."""
RACE_SECONDS = 60.0


class Opener:
    """Makes consensus instances on one location and closes them all on exit."""

    def __init__(self, make: Callable[[], Consensus]) -> None:
        self._make = make
        self._opened: list[Consensus] = []
        self._lock = threading.Lock()

    def __call__(self) -> Consensus:
        return self.track(self._make())

    def track(self, consensus: C) -> C:
        """Close ``consensus`` (made some other way) on exit too; returns it."""
        with self._lock:
            self._opened.append(consensus)
        return consensus

    def __enter__(self) -> Opener:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        errors = []
        for consensus in self._opened:
            try:
                consensus.close()
            except Exception as error:  # close the rest; report the first
                errors.append(error)
        if errors:
            raise errors[0]


@dataclass
class Faulty:
    """A consensus whose writes go through ``faults``; ``other`` reaches the same location
    directly (it is how ``meanwhile`` actions write)."""

    consensus: Consensus
    faults: WriteFaults
    other: Consensus


def append(consensus: Consensus, key: str, data: bytes) -> int:
    """Append ``data`` after the current head (no race expected); returns its seqno."""
    head = consensus.head(key)
    expected = head.seqno if head is not None else None
    assert consensus.compare_and_set(key, expected, data) == Committed()
    return (expected or 0) + 1


def _run_threads(
    target: Callable[[int, Consensus], None],
    instances: list[Consensus],
    barrier: threading.Barrier,
) -> None:
    """Run ``target(i, instances[i])`` on one thread each; re-raise the first failure (which
    breaks ``barrier``, so the other racers stop instead of waiting for it)."""
    errors: list[BaseException] = []

    def run(index: int, consensus: Consensus) -> None:
        try:
            target(index, consensus)
        except threading.BrokenBarrierError:
            pass  # another racer failed first; its error is the one to report
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [
        threading.Thread(target=run, args=(i, c), name=f"racer-{i}")
        for i, c in enumerate(instances)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=RACE_SECONDS + 30)
    assert not any(thread.is_alive() for thread in threads), "a racer hung"
    if errors:
        raise errors[0]


def assert_newer(consensus: Consensus, result: object, expected: int) -> None:
    """``result`` is a ``Mismatch`` carrying a real entry newer than ``expected`` (the
    object-store log returns the one at ``expected + 1``, PostgreSQL the head)."""
    assert isinstance(result, Mismatch), result
    current = result.current
    assert current is not None and current.seqno > expected, result
    assert consensus.scan(KEY, current.seqno, 1) == [current]


class ConsensusConformance:
    """Mix-in of conformance tests; subclasses provide the ``open_consensus`` fixture."""

    @pytest.fixture
    def faulty(self) -> Faulty | None:
        """A consensus with write faults beneath it; ``None`` skips those tests."""
        return None

    @pytest.fixture
    def consensus(self, open_consensus: Opener) -> Consensus:
        return open_consensus()

    # Head and compare-and-set.

    def test_empty_log_has_no_head(self, consensus: Consensus) -> None:
        assert consensus.head(KEY) is None
        assert consensus.scan(KEY, 0, 10) == []
        assert consensus.list_keys() == []

    def test_first_cas_with_none_writes_seqno_1(self, consensus: Consensus) -> None:
        assert consensus.compare_and_set(KEY, None, b"one") == Committed()
        assert consensus.head(KEY) == VersionedData(1, b"one")

    def test_cas_appends_at_head_plus_one(self, consensus: Consensus) -> None:
        for n in range(1, 6):
            assert consensus.compare_and_set(KEY, n - 1 or None, b"v%d" % n) == Committed()
            assert consensus.head(KEY) == VersionedData(n, b"v%d" % n)
        assert [e.seqno for e in consensus.scan(KEY, 0, 100)] == [1, 2, 3, 4, 5]

    def test_cas_with_none_on_a_log_is_a_mismatch(self, consensus: Consensus) -> None:
        append(consensus, KEY, b"first")
        result = consensus.compare_and_set(KEY, None, b"again")
        assert result == Mismatch(VersionedData(1, b"first"))
        assert consensus.scan(KEY, 0, 10) == [VersionedData(1, b"first")]

    def test_cas_with_stale_expected_is_a_mismatch_with_a_newer_entry(
        self, consensus: Consensus
    ) -> None:
        for n in range(3):
            append(consensus, KEY, b"v%d" % n)
        assert_newer(consensus, consensus.compare_and_set(KEY, 1, b"stale"), 1)
        assert [e.data for e in consensus.scan(KEY, 0, 10)] == [b"v0", b"v1", b"v2"]

    def test_cas_with_future_expected_is_a_mismatch(self, consensus: Consensus) -> None:
        result = consensus.compare_and_set(KEY, 3, b"ahead of an empty log")
        assert result == Mismatch(None)
        append(consensus, KEY, b"v1")
        append(consensus, KEY, b"v2")
        result = consensus.compare_and_set(KEY, 5, b"ahead")
        assert result == Mismatch(VersionedData(2, b"v2"))
        assert [e.data for e in consensus.scan(KEY, 0, 10)] == [b"v1", b"v2"]
        assert consensus.compare_and_set(KEY, 2, b"v3") == Committed()

    def test_head_sees_commits_of_other_instances(self, open_consensus: Opener) -> None:
        a, b = open_consensus(), open_consensus()
        assert a.compare_and_set(KEY, None, b"from a") == Committed()
        assert b.head(KEY) == VersionedData(1, b"from a")
        assert b.compare_and_set(KEY, 1, b"from b") == Committed()
        assert a.head(KEY) == VersionedData(2, b"from b")
        assert a.compare_and_set(KEY, 1, b"stale a") == Mismatch(VersionedData(2, b"from b"))
        assert a.compare_and_set(KEY, 2, b"a again") == Committed()
        assert b.head(KEY) == VersionedData(3, b"a again")

    def test_data_round_trips_exactly(self, consensus: Consensus) -> None:
        payloads = [b"", bytes(range(256)), b"\x00" * 10, bytes(range(256)) * 256]
        for data in payloads:
            append(consensus, KEY, data)
        assert [e.data for e in consensus.scan(KEY, 0, 10)] == payloads
        head = consensus.head(KEY)
        assert head is not None and head.data == payloads[-1]

    def test_keys_are_separate_logs(self, consensus: Consensus) -> None:
        append(consensus, "a", b"a1")
        append(consensus, "b", b"b1")
        append(consensus, "a", b"a2")
        assert consensus.head("a") == VersionedData(2, b"a2")
        assert consensus.head("b") == VersionedData(1, b"b1")
        assert consensus.compare_and_set("b", 1, b"b2") == Committed()
        assert consensus.scan("a", 0, 10) == [VersionedData(1, b"a1"), VersionedData(2, b"a2")]

    def test_list_keys(self, consensus: Consensus) -> None:
        for key in ("zeta", "alpha", "m.x_y-1"):
            append(consensus, key, b"x")
        append(consensus, "alpha", b"y")
        assert consensus.list_keys() == ["alpha", "m.x_y-1", "zeta"]

    # Scans.

    def test_scan_from_and_limit(self, consensus: Consensus) -> None:
        for n in range(1, 6):
            append(consensus, KEY, b"v%d" % n)

        def seqnos(from_seqno: int, limit: int) -> list[int]:
            entries = consensus.scan(KEY, from_seqno, limit)
            assert all(e.data == b"v%d" % e.seqno for e in entries)
            return [e.seqno for e in entries]

        assert seqnos(0, 100) == [1, 2, 3, 4, 5]
        assert seqnos(1, 100) == [1, 2, 3, 4, 5]
        assert seqnos(3, 100) == [3, 4, 5]
        assert seqnos(2, 2) == [2, 3]
        assert seqnos(5, 1) == [5]
        assert seqnos(1, 1) == [1]
        assert seqnos(6, 10) == []
        assert seqnos(SEQNO_MAX, 10) == []

    # Truncation.

    def test_truncate_below_the_head(self, consensus: Consensus) -> None:
        for n in range(1, 6):
            append(consensus, KEY, b"v%d" % n)
        assert consensus.truncate(KEY, 3) == 2
        assert [e.seqno for e in consensus.scan(KEY, 0, 10)] == [3, 4, 5]
        assert [e.seqno for e in consensus.scan(KEY, 2, 10)] == [3, 4, 5]
        assert consensus.head(KEY) == VersionedData(5, b"v5")
        assert consensus.truncate(KEY, 2) == 0  # below the earliest entry: nothing to do
        assert consensus.truncate(KEY, 3) == 0

    def test_truncate_at_the_head_keeps_the_head(self, consensus: Consensus) -> None:
        for n in range(1, 4):
            append(consensus, KEY, b"v%d" % n)
        assert consensus.truncate(KEY, 3) == 2
        assert consensus.scan(KEY, 0, 10) == [VersionedData(3, b"v3")]
        assert consensus.head(KEY) == VersionedData(3, b"v3")
        assert consensus.compare_and_set(KEY, 3, b"v4") == Committed()
        assert_newer(consensus, consensus.compare_and_set(KEY, 2, b"stale"), 2)
        assert [e.data for e in consensus.scan(KEY, 0, 10)] == [b"v3", b"v4"]

    def test_truncate_above_the_head_is_an_error(self, consensus: Consensus) -> None:
        with pytest.raises(InvalidArgument, match="head"):
            consensus.truncate(KEY, 1)
        for n in range(1, 4):
            append(consensus, KEY, b"v%d" % n)
        with pytest.raises(InvalidArgument, match="head"):
            consensus.truncate(KEY, 4)
        assert [e.seqno for e in consensus.scan(KEY, 0, 10)] == [1, 2, 3]

    def test_truncated_log_goes_on(self, open_consensus: Opener) -> None:
        a, b = open_consensus(), open_consensus()
        for n in range(1, 5):
            append(a, KEY, b"v%d" % n)
        assert b.truncate(KEY, 4) == 3
        assert a.head(KEY) == VersionedData(4, b"v4")
        assert_newer(a, a.compare_and_set(KEY, None, b"as if empty"), 0)
        assert a.compare_and_set(KEY, 4, b"v5") == Committed()
        assert b.head(KEY) == VersionedData(5, b"v5")
        assert a.list_keys() == [KEY]

    # Arguments and life cycle.

    def test_invalid_arguments_write_nothing(self, consensus: Consensus) -> None:
        bad_calls: list[Callable[[], object]] = [
            lambda: consensus.head(""),
            lambda: consensus.head("a/b"),
            lambda: consensus.head(".hidden"),
            lambda: consensus.head("x" * 129),
            lambda: consensus.compare_and_set("a/b", None, b"x"),
            lambda: consensus.compare_and_set(KEY, 0, b"x"),
            lambda: consensus.compare_and_set(KEY, -1, b"x"),
            lambda: consensus.compare_and_set(KEY, True, b"x"),
            lambda: consensus.compare_and_set(KEY, SEQNO_MAX, b"x"),
            lambda: consensus.compare_and_set(KEY, None, "text"),  # type: ignore[arg-type]
            lambda: consensus.compare_and_set(KEY, None, bytearray(b"x")),  # type: ignore[arg-type]
            lambda: consensus.scan(KEY, -1, 10),
            lambda: consensus.scan(KEY, 0, 0),
            lambda: consensus.truncate(KEY, 0),
        ]
        for call in bad_calls:
            with pytest.raises(InvalidArgument):
                call()
        assert consensus.head(KEY) is None
        assert consensus.list_keys() == []

    def test_closed_consensus_refuses_calls(self, open_consensus: Opener) -> None:
        with open_consensus() as consensus:
            append(consensus, KEY, b"x")
        with pytest.raises(ClosedError):
            consensus.head(KEY)
        with pytest.raises(ClosedError):
            consensus.compare_and_set(KEY, 1, b"y")
        consensus.close()  # idempotent
        assert open_consensus().head(KEY) == VersionedData(1, b"x")

    # Concurrency.

    def test_racing_writers_in_lockstep_one_winner_per_round(self, open_consensus: Opener) -> None:
        """8 threads, each with its own instance (as separate processes would be), in rounds:
        all read the head, then all compare-and-set at once from it. Every round has
        exactly one winner, every loser's ``Mismatch`` names a real newer entry, and the log
        is contiguous and holds exactly the winners' bytes."""
        instances = [open_consensus() for _ in range(RACE_THREADS)]
        barrier = threading.Barrier(RACE_THREADS, timeout=RACE_SECONDS)
        results: list[list[tuple[int, bool, bytes]]] = [[] for _ in range(RACE_ROUNDS)]
        lock = threading.Lock()

        def race(thread: int, consensus: Consensus) -> None:
            for round_no in range(RACE_ROUNDS):
                head = consensus.head(KEY)
                barrier.wait()  # everyone has read the same head
                expected = head.seqno if head is not None else None
                data = b"t%d-r%d" % (thread, round_no)
                result = consensus.compare_and_set(KEY, expected, data)
                if isinstance(result, Mismatch):
                    assert result.current is not None
                    assert result.current.seqno > (expected or 0)
                with lock:
                    results[round_no].append(
                        ((expected or 0) + 1, isinstance(result, Committed), data)
                    )
                barrier.wait()  # every CAS of this round is done

        _run_threads(race, instances, barrier)
        won = []
        for round_no, outcomes in enumerate(results):
            assert {seqno for seqno, _, _ in outcomes} == {round_no + 1}, "same head"
            winners = [data for _, committed, data in outcomes if committed]
            assert len(winners) == 1, f"round {round_no}: {len(winners)} winners"
            won.append(VersionedData(round_no + 1, winners[0]))
        assert instances[0].scan(KEY, 0, RACE_ROUNDS + 10) == won
        assert instances[-1].head(KEY) == won[-1]

    @pytest.mark.parametrize("sharing", ["own instances", "one shared instance"])
    def test_racing_writers_free_running(self, open_consensus: Opener, sharing: str) -> None:
        """The same 8 writers without rounds (head, CAS, repeat; bounded in iterations and
        time) until the log holds RACE_ENTRIES entries: one winner per seqno, a contiguous
        log of exactly the winners' bytes, whatever the interleaving. Also with all threads
        on one instance (its caches and connection are shared)."""
        if sharing == "own instances":
            instances = [open_consensus() for _ in range(RACE_THREADS)]
        else:
            instances = [open_consensus()] * RACE_THREADS
        start = threading.Barrier(RACE_THREADS, timeout=RACE_SECONDS)
        deadline = time.monotonic() + RACE_SECONDS
        won: list[tuple[int, bytes]] = []
        lock = threading.Lock()

        def race(thread: int, consensus: Consensus) -> None:
            start.wait()
            for attempt in range(RACE_ATTEMPTS):
                head = consensus.head(KEY)
                expected = head.seqno if head is not None else None
                if (expected or 0) >= RACE_ENTRIES or time.monotonic() > deadline:
                    return
                data = b"t%d-%d" % (thread, attempt)
                result = consensus.compare_and_set(KEY, expected, data)
                if isinstance(result, Committed):
                    with lock:
                        won.append(((expected or 0) + 1, data))

        _run_threads(race, instances, start)
        assert sorted(seqno for seqno, _ in won) == list(range(1, RACE_ENTRIES + 1))
        log = instances[0].scan(KEY, 0, RACE_ENTRIES + 10)
        assert log == [VersionedData(seqno, data) for seqno, data in sorted(won)]

    # An uncertain write, resolved by reading it back (needs the ``faulty`` fixture).

    @staticmethod
    def _faulty(faulty: Faulty | None) -> Faulty:
        if faulty is None:
            pytest.skip("this location has no write-fault injection")
        return faulty

    def test_lost_reply_is_read_back_as_committed(self, faulty: Faulty | None) -> None:
        f = self._faulty(faulty)
        append(f.consensus, KEY, b"v1")
        f.faults.arm("lost_reply")
        assert f.consensus.compare_and_set(KEY, 1, b"v2") == Committed()
        assert f.faults.fired == 1
        assert f.other.scan(KEY, 0, 10) == [VersionedData(1, b"v1"), VersionedData(2, b"v2")]

    def test_lost_reply_then_another_append_is_still_committed(self, faulty: Faulty | None) -> None:
        f = self._faulty(faulty)
        append(f.consensus, KEY, b"v1")
        f.faults.arm("lost_reply", meanwhile=lambda: append(f.other, KEY, b"other v3"))
        assert f.consensus.compare_and_set(KEY, 1, b"ours v2") == Committed()
        f.faults.heal()
        assert [e.data for e in f.other.scan(KEY, 0, 10)] == [b"v1", b"ours v2", b"other v3"]

    def test_timeout_while_another_takes_the_slot_is_a_mismatch(
        self, faulty: Faulty | None
    ) -> None:
        f = self._faulty(faulty)
        append(f.consensus, KEY, b"v1")
        f.faults.arm("timeout", meanwhile=lambda: append(f.other, KEY, b"theirs"))
        result = f.consensus.compare_and_set(KEY, 1, b"ours")
        f.faults.heal()
        assert result == Mismatch(VersionedData(2, b"theirs"))
        assert [e.data for e in f.other.scan(KEY, 0, 10)] == [b"v1", b"theirs"]

    def test_failure_before_the_write_is_retried(self, faulty: Faulty | None) -> None:
        f = self._faulty(faulty)
        f.faults.arm("fail")
        assert f.consensus.compare_and_set(KEY, None, b"v1") == Committed()
        assert f.faults.fired == 1
        assert f.other.scan(KEY, 0, 10) == [VersionedData(1, b"v1")]

    def test_failure_before_the_write_while_another_takes_the_slot_is_a_mismatch(
        self, faulty: Faulty | None
    ) -> None:
        f = self._faulty(faulty)
        f.faults.arm("fail", meanwhile=lambda: append(f.other, KEY, b"theirs"))
        assert f.consensus.compare_and_set(KEY, None, b"ours") == Mismatch(
            VersionedData(1, b"theirs")
        )
        f.faults.heal()
        assert f.other.scan(KEY, 0, 10) == [VersionedData(1, b"theirs")]

    def test_lost_reply_and_failed_read_back_is_indefinite(self, faulty: Faulty | None) -> None:
        f = self._faulty(faulty)
        append(f.consensus, KEY, b"v1")
        f.faults.arm("lost_reply", then_unreachable=True)
        with pytest.raises(StoreUnavailable) as raised:
            f.consensus.compare_and_set(KEY, 1, b"v2")
        assert raised.value.definite is False
        f.faults.heal()
        # It did land: whoever looks next sees it, and the writer's next CAS builds on it.
        assert f.consensus.head(KEY) == VersionedData(2, b"v2")
        assert f.consensus.compare_and_set(KEY, 2, b"v3") == Committed()

    def test_timeout_and_failed_read_back_is_indefinite(self, faulty: Faulty | None) -> None:
        f = self._faulty(faulty)
        f.faults.arm("timeout", then_unreachable=True)
        with pytest.raises(StoreUnavailable) as raised:
            f.consensus.compare_and_set(KEY, None, b"v1")
        assert raised.value.definite is False
        f.faults.heal()
        assert f.consensus.head(KEY) is None  # it did not land
        assert f.consensus.compare_and_set(KEY, None, b"v1 again") == Committed()
