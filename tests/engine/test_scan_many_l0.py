"""Reads over many overlapping L0 SSTs (issue 33): scans merge them a window at a time with
the columnar merge compaction uses (``newest_columns``), and must equal a dict model
forwards, backwards and over ranges, tombstones and rewritten keys included."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from slatepy import Db, DbReader, Settings
from slatepy.compactor import Compactor
from slatepy.compactor.planner import CompactionPolicy
from slatepy.store import open_store
from slatepy.table.merge import merge_newest, newest_columns

OFF = Settings(compactor="off", block_size=512)
L0S = 12


def many_l0(tmp_path: Path) -> tuple[str, dict[bytes, bytes]]:
    """A database of ``L0S`` overlapping L0 SSTs (each flush compacted to L0 alone, never
    into a run), then a memtable over them; and the dict model of its contents."""
    url = f"file://{tmp_path}/db"
    rng = random.Random(33)
    model: dict[bytes, bytes] = {}
    with Db.open(url, settings=OFF) as db:
        for flush in range(L0S):
            for _ in range(300):
                key = b"k%05d" % rng.randrange(2000)
                if rng.random() < 0.15:
                    db.delete(key, await_durable=False)
                    model.pop(key, None)
                else:
                    value = b"f%d-%s" % (flush, key)
                    db.put(key, value, await_durable=False)
                    model[key] = value
            db.flush()
            policy = CompactionPolicy(l0_trigger=1000)
            Compactor(open_store(url), settings=OFF, policy=policy).run_until_idle()
        db.refresh()
        assert len(db._view.l0) >= L0S and not db._view.sorted_runs
    return url, model


def rows(model: dict[bytes, bytes], lo: bytes, hi: bytes | None) -> list[tuple[bytes, bytes]]:
    return sorted((k, v) for k, v in model.items() if k >= lo and (hi is None or k < hi))


def test_a_scan_over_many_l0_ssts_equals_the_model(tmp_path: Path) -> None:
    url, model = many_l0(tmp_path)
    with DbReader.open(url, settings=OFF) as reader:
        assert list(reader.scan()) == rows(model, b"", None)
        assert list(reader.scan(reverse=True)) == rows(model, b"", None)[::-1]
        assert list(reader.scan(b"k00500", b"k01500")) == rows(model, b"k00500", b"k01500")
        got = [(k, v) for batch in reader.scan_batches(b"k00100", None) for k, v in batch]
        assert got == rows(model, b"k00100", None)
        keys = sorted({b"k%05d" % i for i in range(0, 2000, 7)})
        assert reader.get_many(keys) == [model.get(k) for k in keys]
        assert [reader.get(k) for k in keys] == [model.get(k) for k in keys]
    with Db.open(url, settings=OFF) as db:  # and with a memtable over the L0 SSTs
        db.put(b"k00001", b"mem", await_durable=False)
        db.delete(b"k00002", await_durable=False)
        model[b"k00001"] = b"mem"
        model.pop(b"k00002", None)
        assert list(db.scan()) == rows(model, b"", None)
        assert list(db.scan(reverse=True)) == rows(model, b"", None)[::-1]


versions = st.lists(
    st.tuples(st.integers(0, 30), st.integers(0, 5), st.one_of(st.none(), st.binary(max_size=2))),
    max_size=30,
)


@given(st.lists(versions, min_size=1, max_size=5))
def test_newest_columns_keeps_what_merge_newest_keeps(sources: list[list]) -> None:  # type: ignore[type-arg]
    """Ties on seq go to the earlier source, and seqs out of source order (older versions in
    an earlier source) are sorted out, as the entry-at-a-time merge does."""
    parts = []
    for source in sources:
        unique = {b"%02d" % k: (seq, v) for k, seq, v in source}  # one version per key
        keys = sorted(unique)
        parts.append((keys, [unique[k][0] for k in keys], [unique[k][1] for k in keys]))
    expected = list(merge_newest(iter(list(zip(*p, strict=True))) for p in parts))
    keys, seqs, values = newest_columns(parts)
    assert list(zip(keys, seqs, values, strict=True)) == expected


def test_a_get_over_many_l0_ssts_asks_their_filters_before_their_blocks(tmp_path: Path) -> None:
    """With blocks cached, a get used to look up a block in every L0 SST down to the one
    holding the key (about half of them); from FILTER_FIRST_L0 SSTs on, each SST's filter
    (the key hashed once) rules it out first, so a get looks up about one block."""
    url, model = many_l0(tmp_path)
    keys = sorted(model)
    with DbReader.open(url, settings=OFF) as reader:
        assert [reader.get(k) for k in keys] == [model[k] for k in keys]  # warms the caches
        before = reader._tables.stats()
        assert [reader.get(k) for k in keys] == [model[k] for k in keys]
        after = reader._tables.stats()
    lookups = (after.block_hits + after.block_misses) - (before.block_hits + before.block_misses)
    assert lookups <= 1.2 * len(keys)  # one block per get, and the filters' false positives
