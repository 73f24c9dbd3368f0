"""The write path's fast paths (RFC 0006, write-path addendum) against the general ones: a
single put or delete (``Db._apply_one``), a batch of puts alone (one dict of versions into
the WAL buffer and the memtable; its WAL SST encoded by ``SstBuilder.extend``) and the
``type(x) is bytes`` checks must leave exactly what the entry-by-entry paths leave."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slatepy import Db, Settings, WriteBatch
from slatepy.config import MAX_KEY_SIZE, MAX_VALUE_SIZE
from slatepy.engine.batch import check_key, check_value, expiring
from slatepy.engine.memtable import Memtable
from slatepy.errors import InvalidArgument, TransactionConflict
from slatepy.format.kinds import Expiring, Operands
from slatepy.store.url import open_store

FAST = Settings(flush_interval=60, compactor="off", gc_min_age=3600)
KEYS = [b"a", b"b", b"c", b"d", b"e"]
FAR = 1_000_000.0  # a TTL that does not run out during a test


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def concat(key: bytes, existing: bytes | None, operands: list[bytes]) -> bytes:
    return (existing or b"") + b"".join(operands)


key_st = st.sampled_from(KEYS)
value_st = st.binary(max_size=12)
# One write: ("put", key, value, ttl), ("delete", key), ("merge", key, operand),
# ("range", start, end); a batch is a list of them, a single write a list of one.
put_st = st.tuples(st.just("put"), key_st, value_st, st.sampled_from([None, FAR]))
op_st = st.one_of(
    put_st,
    st.tuples(st.just("delete"), key_st),
    st.tuples(st.just("merge"), key_st, value_st),
    st.tuples(st.just("range"), key_st, key_st).filter(lambda op: op[1] < op[2]),
)
write_st = st.one_of(
    st.lists(put_st, min_size=2, max_size=8),  # puts alone: the bulk path
    st.lists(op_st, min_size=1, max_size=8),
    st.lists(op_st, min_size=1, max_size=1).map(lambda ops: [*ops, ("single",)]),
)


def apply_model(model: dict[bytes, bytes], ops: list[tuple]) -> None:
    for op in ops:
        if op[0] == "put":
            model[op[1]] = op[2]
        elif op[0] == "delete":
            model.pop(op[1], None)
        elif op[0] == "merge":
            model[op[1]] = model.get(op[1], b"") + op[2]
        elif op[0] == "range":
            for key in [k for k in model if op[1] <= k < op[2]]:
                del model[key]


def write(db: Db, ops: list[tuple]) -> None:
    if ops[-1] == ("single",):  # the single-write calls
        op = ops[0]
        if op[0] == "put":
            db.put(op[1], op[2], ttl=op[3], await_durable=False)
        elif op[0] == "delete":
            db.delete(op[1], await_durable=False)
        elif op[0] == "merge":
            db.merge(op[1], op[2], await_durable=False)
        else:
            db.delete_range(op[1], op[2], await_durable=False)
        return
    batch = WriteBatch()
    for op in ops:
        add_to(batch, op)
    db.write(batch, await_durable=False)


def add_to(batch: WriteBatch, op: tuple) -> None:
    """Add one generated op (put, delete, merge or range delete) to ``batch``."""
    if op[0] == "put":
        batch.put(op[1], op[2], ttl=op[3])
    elif op[0] == "delete":
        batch.delete(op[1])
    elif op[0] == "merge":
        batch.merge(op[1], op[2])
    else:
        batch.delete_range(op[1], op[2])


def contents(db: Db) -> dict[bytes, bytes]:
    scanned = dict(db.scan())
    assert db.get_many(KEYS) == [scanned.get(k) for k in KEYS]
    assert [db.get(k) for k in KEYS] == [scanned.get(k) for k in KEYS]
    return scanned


@settings(max_examples=60, deadline=None)
@given(writes=st.lists(write_st, min_size=1, max_size=12))
def test_mixed_writes_read_as_the_model_before_and_after_replay(writes: list[list[tuple]]) -> None:
    store = open_store("memory://")
    clock = Clock()
    model: dict[bytes, bytes] = {}
    db = Db.open(store, settings=FAST, clock=clock, merge_operator=concat)
    try:
        for ops in writes:
            write(db, ops)
            apply_model(model, [op for op in ops if op != ("single",)])
            assert contents(db) == model
    finally:
        db.close()
    # Replayed from the WAL SSTs (those of puts alone encoded by SstBuilder.extend).
    db = Db.open(store, settings=FAST, clock=clock, merge_operator=concat)
    try:
        assert contents(db) == model
    finally:
        db.close()


def _memtable_state(table: Memtable) -> tuple[object, ...]:
    return dict(table._data), table.size_bytes, table.range(b"", None)


@settings(max_examples=100, deadline=None)
@given(
    before=st.lists(st.tuples(key_st, st.one_of(st.none(), value_st)), max_size=8),
    batch=st.lists(st.tuples(key_st, value_st), min_size=1, max_size=8),
    give_payload=st.booleans(),
)
def test_memtable_apply_versions_is_apply_entry_by_entry(
    before: list[tuple[bytes, bytes | None]], batch: list[tuple[bytes, bytes]], give_payload: bool
) -> None:
    bulk, single = Memtable(), Memtable()
    for seq, (key, value) in enumerate(before, 1):
        bulk.put(key, seq, value)
        single.put(key, seq, value)
    seq = len(before) + 1
    versions = dict((key, (seq, value)) for key, value in batch)
    payload = sum(len(key) + len(version[1] or b"") for key, version in versions.items())
    bulk.apply_versions(versions, payload if give_payload else None)
    single.apply([(key, seq, value) for key, value in batch])
    assert _memtable_state(bulk) == _memtable_state(single)
    # Each new key once in the unsorted tail, in the order first written.
    assert bulk._new_keys == single._new_keys


class ReferenceBatch:
    """WriteBatch's documented behaviour, kept plainly: a list of (key, value) ops."""

    def __init__(self) -> None:
        self.ops: list[tuple[bytes, object]] = []
        self.ttls: dict[int, float] = {}
        self.ranges: list[tuple[bytes, bytes]] = []

    def add(self, op: tuple) -> None:
        if op[0] == "put":
            if op[3] is not None:
                self.ttls[len(self.ops)] = op[3]
            self.ops.append((op[1], op[2]))
        elif op[0] == "delete":
            self.ops.append((op[1], None))
        elif op[0] == "merge":
            self.ops.append((op[1], Operands.of([op[2]])))
        else:
            kept = [(i, o) for i, o in enumerate(self.ops) if not op[1] <= o[0] < op[2]]
            self.ttls = {j: self.ttls[i] for j, (i, _) in enumerate(kept) if i in self.ttls}
            self.ops = [o for _, o in kept]
            self.ranges.append((op[1], op[2]))

    def ops_at(self, now_ms: int, default_ttl: float | None) -> list[tuple[bytes, object]]:
        out = []
        for i, (key, value) in enumerate(self.ops):
            ttl = self.ttls.get(i, default_ttl)
            if ttl is not None and value.__class__ is bytes:
                out.append((key, expiring(value, ttl, now_ms)))  # type: ignore[arg-type]
            else:
                out.append((key, value))
        return out


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(op_st, max_size=10),
    default_ttl=st.sampled_from([None, 5.0]),
)
def test_write_batch_holds_what_its_calls_describe(
    ops: list[tuple], default_ttl: float | None
) -> None:
    """The batch's columns read back as the documented list of ops: last op wins, a range
    delete drops the earlier ops in its range, TTLs stay with their puts; puts_at gives the
    columns exactly when the batch holds puts alone."""
    batch, reference = WriteBatch(), ReferenceBatch()
    for op in ops:
        reference.add(op)
        add_to(batch, op)
    now = 1_700_000_000_000
    assert batch.ops == reference.ops
    assert batch.ranges == reference.ranges
    assert len(batch) == len(reference.ops) + len(reference.ranges)
    assert batch.has_merges == any(v.__class__ is Operands for _, v in reference.ops)
    expected = reference.ops_at(now, default_ttl)
    assert batch.ops_at(now, default_ttl) == expected
    assert [v.__class__ for _, v in batch.ops_at(now, default_ttl)] == [
        v.__class__ for _, v in expected
    ]
    puts = batch.puts_at(now, default_ttl)
    if all(op[0] == "put" for op in ops):
        assert puts is not None
        assert list(puts) == expected and len(puts) == len(expected)
        assert [puts[i] for i in range(len(puts))] == puts[:] == expected
    else:
        assert puts is None


def test_ttls_expire_through_the_single_and_the_bulk_paths() -> None:
    store, clock = open_store("memory://"), Clock()
    settings_ = Settings(flush_interval=60, compactor="off", gc_min_age=3600, default_ttl=10.0)
    db = Db.open(store, settings=settings_, clock=clock)
    db.put(b"single", b"1", await_durable=False)
    db.put(b"own", b"2", ttl=100.0, await_durable=False)
    db.write(WriteBatch().put(b"b1", b"3").put(b"b2", b"4", ttl=100.0), await_durable=False)
    assert db._memtable.get(b"b1")[1].__class__ is Expiring  # type: ignore[index]
    clock.now += 50
    assert dict(db.scan()) == {b"own": b"2", b"b2": b"4"}
    db.close()
    db = Db.open(store, settings=settings_, clock=clock)
    assert dict(db.scan()) == {b"own": b"2", b"b2": b"4"}
    clock.now += 100
    assert dict(db.scan()) == {}
    db.close()


@pytest.mark.parametrize("single", [True, False])
def test_a_transaction_conflicts_with_a_fast_path_write(single: bool) -> None:
    db = Db.open(open_store("memory://"), settings=FAST)
    txn = db.begin()
    txn.put(b"k", b"txn")
    if single:
        db.put(b"k", b"other", await_durable=False)
    else:
        db.write(WriteBatch().put(b"j", b"x").put(b"k", b"other"), await_durable=False)
    with pytest.raises(TransactionConflict):
        txn.commit()
    assert db.get(b"k") == b"other"
    db.close()


BAD_KEYS = [b"", b"k" * (MAX_KEY_SIZE + 1), "str", 5, None]
BAD_VALUES = [b"v" * (MAX_VALUE_SIZE + 1), "str", None]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_fail_the_same_everywhere(key: object) -> None:
    with pytest.raises(InvalidArgument) as expected:
        check_key(key)
    db = Db.open(open_store("memory://"), settings=FAST)
    for call in (
        lambda: db.put(key, b"v"),  # type: ignore[arg-type]
        lambda: WriteBatch().put(key, b"v"),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgument) as raised:
            call()
        assert str(raised.value) == str(expected.value)
    db.close()


@pytest.mark.parametrize("value", BAD_VALUES)
def test_bad_values_fail_the_same_everywhere(value: object) -> None:
    with pytest.raises(InvalidArgument) as expected:
        check_value(value)
    db = Db.open(open_store("memory://"), settings=FAST)
    for call in (
        lambda: db.put(b"k", value),  # type: ignore[arg-type]
        lambda: WriteBatch().put(b"k", value),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgument) as raised:
            call()
        assert str(raised.value) == str(expected.value)
    assert db.get(b"k") is None
    db.close()


def test_buffer_like_keys_and_values_are_stored_as_bytes() -> None:
    db = Db.open(open_store("memory://"), settings=FAST)
    db.put(bytearray(b"k1"), memoryview(b"v1"), await_durable=False)  # type: ignore[arg-type]
    db.write(WriteBatch().put(bytearray(b"k2"), b"v2").put(b"k3", bytearray(b"v3")))  # type: ignore[arg-type]
    versions = [db._memtable.get(k) for k in (b"k1", b"k2", b"k3")]
    assert all(v is not None and v[1].__class__ is bytes for v in versions)
    assert all(k.__class__ is bytes for k in db._memtable._data)
    assert dict(db.scan()) == {b"k1": b"v1", b"k2": b"v2", b"k3": b"v3"}
    db.close()
