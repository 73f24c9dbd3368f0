"""Many threads on one writer while compaction and GC run; two writers racing in a loop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from slatepy import Db, FencedError, Settings
from slatepy.format.sst import decode_sst
from slatepy.store import open_store
from slatepy.store.numbered import NumberedObjects
from slatepy.table.layout import WAL_DIR, WAL_SUFFIX

SECONDS = 3.0


def counter(value: bytes | None) -> int:
    return -1 if value is None else int(value.split(b"=")[1])


def test_threads_write_and_read_while_compaction_and_gc_run(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    settings = Settings(
        compaction_interval=0.02, gc_interval=0.1, gc_min_age=4.0, flush_interval=0.01
    )
    acked: dict[bytes, int] = {}
    errors: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()
    with Db.open(url, settings=settings) as db:

        def writer(w: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                key = b"w%d-k%02d" % (w, n % 20)
                db.put(key, b"%s=%d" % (key, n), await_durable=n % 3 != 0)
                if n % 3 != 0:
                    with lock:
                        acked[key] = n

        def reader() -> None:
            while not stop.is_set():
                with lock:
                    expected = dict(acked)
                for key, at_least in expected.items():
                    assert counter(db.get(key)) >= at_least, key  # never older than acked
                rows = dict(db.scan())
                assert all(counter(rows.get(k)) >= c for k, c in expected.items())

        def guarded(fn, *args):  # type: ignore[no-untyped-def]
            try:
                fn(*args)
            except BaseException as exc:  # surfaced below
                errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=guarded, args=(writer, w)) for w in range(4)]
        threads += [threading.Thread(target=guarded, args=(reader,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(SECONDS)
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        assert not errors, errors
        assert db.wal_id_last_compacted > 0  # compaction really ran meanwhile
        # And the background GC collects the compacted WAL once its grace period passes.
        wal = NumberedObjects(open_store(url), WAL_DIR, WAL_SUFFIX)
        for _ in range(200):  # bounded: 200 x 50 ms
            if wal.ids()[0] > 1:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the in-process GC never collected compacted WAL SSTs")
    with Db.open(url, settings=settings) as db:
        for key, n in acked.items():
            assert counter(db.get(key)) >= n


def test_two_writers_racing_in_a_loop_are_never_alive_together(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    settings = Settings(compactor="off")
    acked: dict[bytes, bytes] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + SECONDS
    opened = {"A": 0, "B": 0}

    def racer(tag: str) -> None:
        n = 0
        while time.monotonic() < deadline:
            try:
                db = Db.open(url, settings=settings)
            except FencedError:
                continue  # the other one opened while we were starting
            opened[tag] += 1
            try:
                while time.monotonic() < deadline:
                    n += 1
                    key, value = b"%s%d" % (tag.encode(), n % 10), b"%s-%d" % (tag.encode(), n)
                    db.put(key, value)
                    with lock:
                        acked[key] = value
            except FencedError:
                pass
            finally:
                db.close()

    threads = [threading.Thread(target=racer, args=(tag,)) for tag in ("A", "B")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert min(opened.values()) >= 2  # they really took turns
    wal = NumberedObjects(open_store(url), WAL_DIR, WAL_SUFFIX)
    epochs = [decode_sst(wal.read(i))[0].props.writer_epoch for i in wal.ids()]
    # One writer at a time: once a newer epoch's fence is in the WAL, no older epoch follows.
    assert epochs == sorted(epochs)
    with Db.open(url, settings=settings) as db:
        for key, value in acked.items():
            assert db.get(key) == value
