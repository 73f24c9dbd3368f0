"""Iterators, reverse/limited/prefix scans and batched scans against a dict model (RFC 0020),
over a database whose keys are spread across sorted runs, L0 and the memtable."""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slatepy import Db, DbReader, InvalidArgument, Settings
from slatepy.engine.iterator import key_bounds, prefix_end
from slatepy.store import open_store
from tests.conftest import Backend
from tests.engine.layered import Op, layered, random_phases

SMALL_BLOCKS = Settings(compactor="off", block_size=512)


def open_layered(backend: Backend, seed: int = 7) -> tuple[Db, dict[bytes, bytes]]:
    settings = Settings.from_dict(
        {**{f: getattr(backend.settings, f) for f in backend.settings.__struct_fields__}}
        | {"block_size": 512}
    )
    store = backend.store()
    db = Db.open(backend.target() if backend.name == "memory" else store, settings=settings)
    model: dict[bytes, bytes] = {}
    layered(db, store, settings, random_phases(seed, 600, 900), model)
    view = db._view
    assert view.sorted_runs and len(view.l0) > 1 and len(db._memtable)
    assert max(len(run.ssts) for run in view.sorted_runs) > 1  # reverse crosses SSTs of a run
    return db, model


def expected(
    model: dict[bytes, bytes], lo: bytes, hi: bytes | None, reverse: bool = False
) -> list[tuple[bytes, bytes]]:
    rows = sorted((k, v) for k, v in model.items() if k >= lo and (hi is None or k < hi))
    return rows[::-1] if reverse else rows


def test_forward_reverse_seek_prefix_limit_and_batches(backend: Backend) -> None:
    db, model = open_layered(backend)
    with db:
        keys = sorted(model)
        assert list(db.scan()) == expected(model, b"", None)
        assert list(db.scan(reverse=True)) == expected(model, b"", None, True)
        assert list(db.scan(b"k00300", b"k00600", reverse=True)) == expected(
            model, b"k00300", b"k00600", True
        )
        assert list(db.scan(limit=5)) == expected(model, b"", None)[:5]
        assert list(db.scan(reverse=True, limit=7)) == expected(model, b"", None, True)[:7]
        assert list(db.scan_prefix(b"k001")) == expected(model, b"k001", b"k002")
        assert (
            list(db.scan_prefix(b"k001", reverse=True, limit=3))
            == expected(model, b"k001", b"k002", True)[:3]
        )
        assert list(db.iter(prefix=b"k0002")) == expected(model, b"k0002", b"k0003")
        batches = list(db.scan_batches(batch_size=64))
        assert all(len(b) == 64 for b in batches[:-1]) and 0 < len(batches[-1]) <= 64
        assert [r for b in batches for r in b] == expected(model, b"", None)
        back = [r for b in db.scan_batches(b"k00100", b"k00800", reverse=True) for r in b]
        assert back == expected(model, b"k00100", b"k00800", True)

        it = db.iter(b"k00100", b"k00800")
        probe = keys[len(keys) // 2]
        it.seek(probe)
        assert next(it) == (probe, model[probe])
        it.seek(b"k00000")  # before the bounds: the first key in them
        assert next(it) == expected(model, b"k00100", b"k00800")[0]
        rev = db.iter(reverse=True)
        rev.seek(probe + b"\x00")
        assert next(rev) == (probe, model[probe])
        rev.seek(b"k0")  # below every key
        assert list(rev) == []


def test_arrow_batches(backend: Backend) -> None:
    db, model = open_layered(backend, seed=3)
    with db:
        table = pa.Table.from_batches(list(db.scan_batches(batch_size=100, format="arrow")))
        assert table.column_names == ["key", "value"]
        assert list(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True)) == (
            expected(model, b"", None)
        )
        columns = list(db.scan_batches(batch_size=33, format="columns", reverse=True))
        assert all(len(k) == len(v) == 33 for k, v in columns[:-1])
        rows = [r for k, v in columns for r in zip(k, v, strict=True)]
        assert rows == expected(model, b"", None, True)


def test_an_iterator_keeps_its_view_across_writes_and_seeks() -> None:
    store = open_store("memory://")
    with Db.open(store, settings=SMALL_BLOCKS) as db:
        for i in range(100):
            db.put(b"k%03d" % i, b"old", await_durable=False)
        it = db.iter()
        assert next(it) == (b"k000", b"old")
        for i in range(100):
            db.put(b"k%03d" % i, b"new", await_durable=False)
        db.delete(b"k050", await_durable=False)
        it.seek(b"k050")
        assert next(it) == (b"k050", b"old")
        assert all(v == b"old" for _, v in it)
        assert db.get(b"k050") is None


@given(
    phases=st.lists(
        st.lists(
            st.tuples(
                st.binary(min_size=1, max_size=3),
                st.one_of(st.none(), st.binary(max_size=8)),
            ),
            max_size=40,
        ),
        min_size=1,
        max_size=5,
    ),
    lo=st.binary(max_size=3),
    hi=st.one_of(st.none(), st.binary(min_size=1, max_size=3)),
    seek=st.binary(min_size=1, max_size=3),
    limit=st.integers(0, 10),
    batch=st.integers(1, 7),
)
def test_reads_match_a_dict_model(  # noqa: PLR0917 - hypothesis passes them by name
    phases: list[list[Op]],
    lo: bytes,
    hi: bytes | None,
    seek: bytes,
    limit: int,
    batch: int,
) -> None:
    if hi is not None and hi < lo:
        lo, hi = hi, lo
    store = open_store("memory://")
    model: dict[bytes, bytes] = {}
    with Db.open(store, settings=SMALL_BLOCKS) as db:
        layered(db, store, SMALL_BLOCKS, phases, model)
        fwd = expected(model, lo, hi)
        assert list(db.scan(lo, hi)) == fwd
        assert list(db.scan(lo, hi, reverse=True)) == fwd[::-1]
        assert list(db.scan(lo, hi, limit=limit)) == fwd[:limit]
        assert [r for b in db.scan_batches(lo, hi, batch_size=batch) for r in b] == fwd
        assert [
            r for b in db.scan_batches(lo, hi, batch_size=batch, reverse=True) for r in b
        ] == fwd[::-1]
        it = db.iter(lo, hi)
        it.seek(seek)
        keys = [k for k, _ in fwd]
        assert list(it) == fwd[bisect_left(keys, seek) :]
        rit = db.iter(lo, hi, reverse=True)
        rit.seek(seek)
        assert list(rit) == fwd[: bisect_right(keys, seek)][::-1]
        prefix = seek[:1]
        assert list(db.scan_prefix(prefix)) == [
            (k, v) for k, v in expected(model, b"", None) if k.startswith(prefix)
        ]
        for key in {k for ops in phases for k, _ in ops}:
            kv = db.get_key_value(key)
            assert (kv is None) == (key not in model)
            if kv is not None:
                assert (kv.key, kv.value) == (key, model[key]) and kv.seq > 0


def test_prefix_bounds() -> None:
    assert prefix_end(b"ab") == b"ac"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") is None
    assert key_bounds(None, None, b"\xff") == (b"\xff", None)
    assert key_bounds(b"b", b"c", b"x") == (b"x", b"x")  # disjoint: empty, not an error
    with pytest.raises(InvalidArgument, match="after end"):
        key_bounds(b"b", b"a", None)


def test_bad_arguments_are_typed() -> None:
    with Db.open("memory://", settings=SMALL_BLOCKS) as db:
        with pytest.raises(InvalidArgument, match="batch_size"):
            db.scan_batches(batch_size=0)
        with pytest.raises(InvalidArgument, match="format"):
            db.scan_batches(format="csv")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="limit"):
            db.scan(limit=-1)
        with pytest.raises(InvalidArgument, match="bytes"):
            db.iter(start="a")  # type: ignore[arg-type]


def test_reader_iterates_the_same_way(backend: Backend) -> None:
    db, model = open_layered(backend, seed=11)
    with db:
        db.flush()
        with DbReader.open(
            backend.target() if backend.name == "memory" else backend.url, settings=backend.settings
        ) as reader:
            assert list(reader.scan(reverse=True)) == expected(model, b"", None, True)
            assert list(reader.scan(limit=3)) == expected(model, b"", None)[:3]
            assert [r for b in reader.scan_batches(batch_size=50) for r in b] == expected(
                model, b"", None
            )
            it = reader.iter(prefix=b"k002")
            assert list(it) == expected(model, b"k002", b"k003")
            key = next(iter(model))
            assert reader[key] == model[key] and key in reader
            with pytest.raises(KeyError):
                reader[b"absent"]
            assert reader.get(b"absent", b"dflt") == b"dflt"


def test_closing_an_iterator_stops_its_read_ahead(tmp_path: object) -> None:
    url = f"file://{tmp_path}/db"
    with Db.open(url, settings=SMALL_BLOCKS) as db:
        for i in range(3000):
            db.put(b"key%06d" % i, b"v" * 100, await_durable=False)
        db.flush()
        it = db.iter()
        next(it)
        it.close()
        assert list(it) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("slatepy-read-ahead")]
