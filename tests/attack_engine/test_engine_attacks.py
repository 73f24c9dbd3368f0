"""An outsider's attack on the engine's read truth (RFC 0026, addendum): features that are
tested alone, met together. Each test here failed on the code before its fix, or records an
attack that found nothing (named in the RFC's addendum)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slatepy import Db
from tests.attack_engine.model_run import SETTINGS, Clock, concat, run


@pytest.mark.parametrize("isolation", ["snapshot", "serializable"])
def test_a_transaction_judges_expiry_as_of_its_start(isolation: str) -> None:
    """A transaction reads its snapshot: a TTL'd value live when it began stays live for
    its gets and its scans, as for ``db.snapshot()`` (RFC 0026 §5: one view, one clock);
    it read the value, then None, in one transaction that then committed."""
    clock = Clock()
    with Db.open("memory://", settings=SETTINGS, clock=clock, merge_operator=concat) as db:
        db.put(b"t", b"live", ttl=5)
        db.put(b"u", b"plain")
        txn = db.begin(isolation)  # type: ignore[arg-type]
        assert txn.get(b"t") == b"live"
        clock.now += 10  # expires for the database, not for the transaction
        assert db.get(b"t") is None
        assert txn.get(b"t") == b"live"
        assert list(txn.scan()) == [(b"t", b"live"), (b"u", b"plain")]
        assert list(txn.scan(reverse=True)) == [(b"u", b"plain"), (b"t", b"live")]
        txn.put(b"u", b"seen " + (txn.get(b"t") or b"nothing"))
        txn.commit()
        assert db.get(b"u") == b"seen live" and db.get(b"t") is None
        later = db.begin(isolation)  # type: ignore[arg-type]
        assert later.get(b"t") is None and list(later.scan()) == [(b"u", b"seen live")]
        later.rollback()


@pytest.mark.parametrize("seed", [3, 11])
def test_every_read_form_agrees_with_a_model_through_kinds_and_maintenance(
    tmp_path: Path, seed: int
) -> None:
    """Random puts, TTL'd puts, deletes, range deletes, merges and mixed batches between
    ticks, flushes, compactions, reopens and GC passes; get, get_many, bounded scans both
    ways with limits, prefix scans, iterators with seek, snapshots, checkpoints,
    transactions, a reader and an iterator held across compaction and GC all agree with a
    dict model at every step (tests/attack_engine/model_run.py). Found nothing on its own
    (60 seeds x 300 steps were run once while writing it); kept as a guard."""
    assert run(tmp_path, seed, steps=120, seconds=6) > 0
