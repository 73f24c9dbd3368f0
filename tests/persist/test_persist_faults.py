"""The consensus test helpers themselves: ``FaultyConsensus`` gives the four outcomes,
``InterceptConsensus`` pauses exactly the chosen call, ``WriteFaults`` reports errors of its
``meanwhile`` actions, and the PostgreSQL server helper says why it cannot run."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from slatepy.errors import StoreUnavailable
from slatepy.persist.location.consensus import Committed, Mismatch, VersionedData
from slatepy.persist.location.objconsensus import ObjectConsensus
from slatepy.store import open_store
from slatepy.testing import postgres
from slatepy.testing.faults import FaultRates
from slatepy.testing.persist_conformance import append
from slatepy.testing.persist_faults import (
    FaultyConsensus,
    InterceptConsensus,
    StoreWriteFaults,
    consensus_uniform,
)

KEY = "orders"


@pytest.fixture
def inner() -> Iterator[ObjectConsensus]:
    with ObjectConsensus(open_store("memory://"), min_age=0) as consensus:
        yield consensus


@pytest.mark.parametrize(
    ("outcome", "definite", "written"),
    [("fail", True, False), ("timeout", False, False), ("lost_reply", False, True)],
)
def test_faulty_consensus_outcomes(
    inner: ObjectConsensus, outcome: str, definite: bool, written: bool
) -> None:
    faulty = FaultyConsensus(inner, {"compare_and_set": FaultRates(**{outcome: 1.0})})
    with pytest.raises(StoreUnavailable) as raised:
        faulty.compare_and_set(KEY, None, b"v1")
    assert raised.value.definite is definite
    assert faulty.counts == {f"compare_and_set:{outcome}": 1}
    assert (inner.head(KEY) is not None) is written
    assert faulty.head(KEY) == inner.head(KEY)  # no rate for head: never fails
    faulty.enabled = False
    expected = 1 if written else None
    assert faulty.compare_and_set(KEY, expected, b"v2") == Committed()


def test_faulty_consensus_is_reproducible_from_its_seed(inner: ObjectConsensus) -> None:
    def run(seed: int) -> dict[str, int]:
        faulty = FaultyConsensus(inner, consensus_uniform(0.3), seed=seed)
        for _ in range(100):
            with contextlib.suppress(StoreUnavailable):
                faulty.list_keys()
        return dict(faulty.counts)

    first = run(7)
    assert first == run(7)
    assert 15 < sum(first.values()) < 45
    assert set(first) <= {"list_keys:fail", "list_keys:timeout", "list_keys:lost_reply"}


def test_a_writer_paused_before_its_cas_loses_to_one_that_went_first(
    inner: ObjectConsensus,
) -> None:
    append(inner, KEY, b"v1")
    paused = InterceptConsensus(inner)
    pause = paused.pause("compare_and_set", key=KEY)
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(paused.compare_and_set(KEY, 1, b"a")))
    thread.start()
    pause.wait_reached()
    assert inner.compare_and_set(KEY, 1, b"b") == Committed()
    pause.release()
    thread.join(30)
    assert out == [Mismatch(VersionedData(2, b"b"))]


def test_a_cas_paused_after_acting_is_visible_before_its_reply(inner: ObjectConsensus) -> None:
    calls: list[tuple[str, str | None]] = []
    slow = InterceptConsensus(inner, before=lambda op, key: calls.append((op, key)))
    pause = slow.pause("compare_and_set", when="after")
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(slow.compare_and_set(KEY, None, b"a")))
    thread.start()
    pause.wait_reached()
    assert inner.head(KEY) == VersionedData(1, b"a")  # committed; its writer does not know
    assert out == []
    pause.release()
    thread.join(30)
    assert out == [Committed()]
    slow.list_keys()
    assert calls == [("compare_and_set", KEY), ("list_keys", None)]


def test_a_hook_that_raises_fails_the_call_before_it_acts(inner: ObjectConsensus) -> None:
    def refuse(op: str, key: str | None) -> None:
        raise StoreUnavailable(f"refused {op}", definite=True)

    with pytest.raises(StoreUnavailable, match="refused compare_and_set"):
        InterceptConsensus(inner, before=refuse).compare_and_set(KEY, None, b"v1")
    assert inner.head(KEY) is None


def test_a_pause_nobody_releases_times_out(inner: ObjectConsensus) -> None:
    intercepted = InterceptConsensus(inner)
    intercepted.pause("head", timeout=0.05)
    with pytest.raises(TimeoutError, match="nobody released"):
        intercepted.head(KEY)
    never = intercepted.pause("scan")
    with pytest.raises(TimeoutError, match="no scan call"):
        never.wait_reached(timeout=0.05)


def test_write_faults_report_errors_of_meanwhile() -> None:
    store = open_store("memory://")
    faults = StoreWriteFaults(store)

    def broken() -> None:
        raise RuntimeError("the other actor failed")

    with ObjectConsensus(faults, min_age=0) as consensus:
        faults.arm("fail", meanwhile=broken)
        assert consensus.compare_and_set(KEY, None, b"v1") == Committed()
    with pytest.raises(RuntimeError, match="other actor"):
        faults.heal()


def test_postgres_helper_explains_missing_binaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    assert postgres.find_bindir() is None
    reason = postgres.missing_reason()
    assert reason is not None and "initdb" in reason
    with pytest.raises(RuntimeError, match="no PostgreSQL binaries"), postgres.postgres_server():
        pass
