"""Compaction end to end: model equivalence, zombie compactors, reopen cost."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slatepy import Db, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.store import open_store
from tests.conftest import Backend

SMALL = CompactionPolicy(l0_trigger=2, size_ratio=2.0, max_wal_ssts=3, target_sst_bytes=600)
FAST = Settings(flush_interval=60, block_size=512, compactor="off")

keys = st.sampled_from([b"k%02d" % i for i in range(12)])
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), keys, st.binary(max_size=40)),
        st.tuples(st.just("delete"), keys, st.none()),
        st.tuples(st.just("batch"), keys, st.binary(max_size=10)),
        st.tuples(st.just("flush"), st.none(), st.none()),
        st.tuples(st.just("compact"), st.none(), st.none()),
        st.tuples(st.just("reopen"), st.none(), st.none()),
    ),
    max_size=40,
)


def check(db: Db, model: dict[bytes, bytes]) -> None:
    for key in [b"k%02d" % i for i in range(12)]:
        assert db.get(key) == model.get(key), key
    assert list(db.scan()) == sorted(model.items())
    assert list(db.scan(b"k03", b"k08")) == sorted(
        (k, v) for k, v in model.items() if b"k03" <= k < b"k08"
    )


@settings(max_examples=40)
@given(ops)
def test_any_interleaving_reads_like_a_dict(
    script: list[tuple[str, bytes | None, bytes | None]],
) -> None:
    store = open_store("memory://")
    model: dict[bytes, bytes] = {}
    db = Db.open(store, settings=FAST)
    compactor = Compactor(store, settings=FAST, policy=SMALL)
    try:
        for op, key, value in script:
            if op == "put":
                assert key is not None and value is not None
                db.put(key, value, await_durable=False)
                model[key] = value
            elif op == "delete":
                assert key is not None
                db.delete(key, await_durable=False)
                model.pop(key, None)
            elif op == "batch":
                assert key is not None and value is not None
                db.write(WriteBatch().put(key, value).delete(b"k11").put(b"k00", value))
                model[key] = value
                model.pop(b"k11", None)
                model[b"k00"] = value
            elif op == "flush":
                db.flush()
            elif op == "compact":
                db.flush()
                compactor.run_until_idle()
                db.refresh()
            else:
                db.close()
                db = Db.open(store, settings=FAST)
                compactor = Compactor(store, settings=FAST, policy=SMALL)
            check(db, model)
        db.flush()
        compactor.run_until_idle()
        db.refresh()
        check(db, model)
    finally:
        db.close()
    with Db.open(store, settings=FAST) as reopened:
        check(reopened, model)


def test_compaction_releases_the_memtable_and_shortens_reopen(backend: Backend) -> None:
    with Db.open(backend.target(), settings=backend.settings) as db:
        for i in range(0, 300, 30):
            batch = WriteBatch()
            for j in range(i, i + 30):
                batch.put(b"key%04d" % j, b"v%d" % j)
            db.write(batch)
        db.delete(b"key0007")
        compactor = Compactor(backend.store(), settings=backend.settings, policy=SMALL)
        assert compactor.run_until_idle() >= 2
        db.refresh()
        assert len(db._memtable) == 0  # everything written is in compacted SSTs now
        assert db.get(b"key0299") == b"v299" and db.get(b"key0007") is None
        db.put(b"after", b"compaction")
    with Db.open(backend.target(), settings=backend.settings) as db:
        # Only what came after the compaction is replayed: the fence... and one put.
        assert db.replayed_ssts == 1
        assert db.get(b"key0150") == b"v150" and db.get(b"after") == b"compaction"
        assert len(list(db.scan())) == 300


def test_in_process_compactor_runs_in_the_writer(backend: Backend) -> None:
    settings = Settings.from_dict(
        {
            **{f: getattr(backend.settings, f) for f in backend.settings.__struct_fields__},
            "compactor": "in-process",
            "compaction_interval": 0.05,
        }
    )
    with Db.open(backend.target(), settings=settings) as db:
        for i in range(20):
            db.put(b"key%02d" % i, b"v%d" % i)
        for _ in range(200):  # bounded: 200 * 20 ms
            if db._view.wal_id_last_compacted >= db.next_wal_id - 1:
                break
            threading.Event().wait(0.02)
        else:
            pytest.fail("the in-process compactor never caught up with the WAL")
        assert len(db._memtable) == 0
        assert [k for k, _ in db.scan()] == [b"key%02d" % i for i in range(20)]
        assert db.get(b"key07") == b"v7"


def test_a_new_writer_sorts_after_compacted_data(backend: Backend) -> None:
    """Regression (found by the model test): seqs restarted below compacted data after reopen."""
    with Db.open(backend.target(), settings=backend.settings) as db:
        db.put(b"k", b"old-1")
        db.put(b"k", b"old-2")
    Compactor(backend.store(), settings=backend.settings).run_until_idle()
    with Db.open(backend.target(), settings=backend.settings) as db:
        db.put(b"k", b"new")
        assert db.get(b"k") == b"new"
        assert list(db.scan()) == [(b"k", b"new")]
