"""The Db API and its durability contract, on every backend."""

from __future__ import annotations

import threading

import pytest

from slatepy import ClosedError, Db, InvalidArgument, NotFound, Settings, WriteBatch
from slatepy.config import MAX_KEY_SIZE, MAX_VALUE_SIZE
from slatepy.store import open_store
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX
from tests.conftest import Backend


def wal_ids(backend: Backend) -> list[int]:
    """The WAL SSTs in the store (not two-phase CAS temporaries that are still completing)."""
    return NumberedObjects(backend.store(), WAL_DIR, WAL_SUFFIX).ids()


def open_db(backend: Backend, **overrides: object) -> Db:
    settings = backend.settings
    if overrides:
        settings = Settings.from_dict({**_fields(settings), **overrides})
    return Db.open(backend.target(), settings=settings)


def _fields(settings: Settings) -> dict[str, object]:
    return {name: getattr(settings, name) for name in settings.__struct_fields__}


def test_put_get_delete(backend: Backend) -> None:
    with open_db(backend) as db:
        assert db.get(b"k") is None
        db.put(b"k", b"v1")
        assert db.get(b"k") == b"v1"
        db.put(b"k", b"v2")
        assert db.get(b"k") == b"v2"
        db.delete(b"k")
        assert db.get(b"k") is None
        db.put(b"empty", b"")
        assert db.get(b"empty") == b""


def test_durable_writes_survive_reopen(backend: Backend) -> None:
    with open_db(backend) as db:
        for i in range(50):
            db.put(b"key%03d" % i, b"value%03d" % i)
        db.delete(b"key007")
        db.write(WriteBatch().put(b"batch-a", b"1").put(b"batch-b", b"2").delete(b"key008"))
    with open_db(backend) as db:
        assert db.get(b"key000") == b"value000"
        assert db.get(b"key049") == b"value049"
        assert db.get(b"key007") is None and db.get(b"key008") is None
        assert db.get(b"batch-a") == b"1" and db.get(b"batch-b") == b"2"


def test_unawaited_writes_become_durable_on_flush_and_close(backend: Backend) -> None:
    with open_db(backend, flush_interval=60) as db:
        db.put(b"a", b"1", await_durable=False)
        wal_before = len(wal_ids(backend))
        db.flush()
        assert len(wal_ids(backend)) == wal_before + 1
        db.put(b"b", b"2", await_durable=False)
    with open_db(backend) as db:
        assert db.get(b"a") == b"1" and db.get(b"b") == b"2"


def test_background_flush_runs_on_the_interval(backend: Backend) -> None:
    with open_db(backend, flush_interval=0.02) as db:
        db.put(b"a", b"1", await_durable=False)
        wal_path = f"wal/{db.next_wal_id:020d}.sst"
        store = backend.store()
        for _ in range(200):  # bounded: 200 * 10 ms
            if any(m.path == wal_path for m in store.list("wal/")):
                break
            threading.Event().wait(0.01)
        else:
            pytest.fail("the background flush never wrote the WAL SST")


def test_scan_is_ordered_and_bounded(backend: Backend) -> None:
    with open_db(backend) as db:
        batch = WriteBatch()
        for key in [b"c", b"a", b"e", b"b", b"d"]:
            batch.put(key, key.upper())
        db.write(batch)
        db.delete(b"d")
        assert list(db.scan(b"b", b"e")) == [(b"b", b"B"), (b"c", b"C")]
        assert [k for k, _ in db.scan()] == [b"a", b"b", b"c", b"e"]
        assert list(db.scan(b"x")) == []
        with pytest.raises(InvalidArgument):
            list(db.scan(b"z", b"a"))


def test_batch_last_write_wins_and_is_one_wal_sst(backend: Backend) -> None:
    with open_db(backend) as db:
        before = len(wal_ids(backend))
        db.write(WriteBatch().put(b"k", b"1").put(b"k", b"2").put(b"j", b"3").delete(b"j"))
        assert len(wal_ids(backend)) == before + 1
        assert db.get(b"k") == b"2" and db.get(b"j") is None


def test_concurrent_durable_writers_share_wal_puts(backend: Backend) -> None:
    threads, per_thread = 8, 25
    with open_db(backend) as db:
        start_puts = db.metrics.requests("put")

        def work(t: int) -> None:
            for i in range(per_thread):
                db.put(b"t%d-%d" % (t, i), b"v")

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join(timeout=60)
        puts = db.metrics.requests("put") - start_puts
        assert len(list(db.scan())) == threads * per_thread
    assert puts <= threads * per_thread
    with open_db(backend) as db:
        assert len(list(db.scan())) == threads * per_thread


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda db: db.put("str-key", b"v"), InvalidArgument),
        (lambda db: db.put(b"k", "str-value"), InvalidArgument),
        (lambda db: db.put(b"", b"v"), InvalidArgument),
        (lambda db: db.put(b"k" * (MAX_KEY_SIZE + 1), b"v"), InvalidArgument),
        (lambda db: db.put(b"k", b"v" * (MAX_VALUE_SIZE + 1)), InvalidArgument),
        (lambda db: db.delete(None), InvalidArgument),
        (lambda db: db.get(123), InvalidArgument),
        (lambda db: db.write([(b"k", b"v")]), InvalidArgument),
        (lambda db: db.write(WriteBatch().put(b"ok", b"v").put(b"", b"x")), InvalidArgument),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(backend: Backend, call, error) -> None:  # type: ignore[no-untyped-def]
    with open_db(backend) as db:
        wal_before = wal_ids(backend)
        with pytest.raises(error):
            call(db)
        db.flush()
        assert wal_ids(backend) == wal_before
        assert list(db.scan()) == []


def test_closed_db_refuses_everything(backend: Backend) -> None:
    db = open_db(backend)
    db.close()
    db.close()  # idempotent
    for call in (
        lambda: db.put(b"k", b"v"),
        lambda: db.get(b"k"),
        lambda: db.delete(b"k"),
        db.scan,
        db.flush,
        lambda: db.write(WriteBatch().put(b"k", b"v")),
    ):
        with pytest.raises(ClosedError):
            call()


def test_open_on_a_missing_bucket_is_not_found(backend: Backend) -> None:
    if not backend.url.startswith("s3://"):
        pytest.skip("buckets exist only on S3")
    url = "s3://no-such-bucket-xyz/db"
    with pytest.raises(NotFound, match="bucket"):
        Db.open(url, settings=backend.settings)
    with pytest.raises(NotFound):
        open_store(url, backend.settings).list("")


def test_reopen_replays_only_uncompacted_wal_and_keeps_sequence_order(backend: Backend) -> None:
    with open_db(backend) as db:
        for i in range(5):
            db.put(b"k", b"v%d" % i)
    with open_db(backend) as db:
        assert db.replayed_ssts >= 5
        assert db.get(b"k") == b"v4"
        db.put(b"k", b"after-reopen")
    with open_db(backend) as db:
        assert db.get(b"k") == b"after-reopen"
