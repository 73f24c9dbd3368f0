"""``max_unflushed_bytes``: writes block while compaction is behind, instead of growing memory."""

from __future__ import annotations

import threading

import pytest

from slatepy import Db, Settings, WriteStalled
from slatepy.compactor import Compactor
from tests.conftest import Backend


def tight(backend: Backend, **overrides: object) -> Settings:
    fields = {f: getattr(backend.settings, f) for f in backend.settings.__struct_fields__}
    return Settings.from_dict(
        {**fields, "flush_bytes": 1024, "max_unflushed_bytes": 8192, **overrides}
    )


# Engine logic, not store behaviour: the local backends are enough (and fast).
LOCAL = pytest.mark.parametrize("backend", ["memory", "file"], indirect=True)


@LOCAL
def test_writes_stall_without_compaction_and_resume_with_it(backend: Backend) -> None:
    settings = tight(backend, write_stall_timeout=0.3)
    with Db.open(backend.target(), settings=settings) as db:
        written = 0
        with pytest.raises(WriteStalled, match="max_unflushed_bytes"):
            for written in range(1000):  # bounded: 1000 x 200 B is far past the limit
                db.put(b"key%04d" % written, b"x" * 200)
        assert db.get(b"key%04d" % written) is None  # the stalled write was not applied
        assert 8192 // 300 <= written < 8192 // 200 + 1

    settings = tight(backend, write_stall_timeout=30)
    with Db.open(backend.target(), settings=settings) as db:  # replays: over the limit again
        compactor = Compactor(backend.store(), settings=settings)
        stop = threading.Event()

        def compact() -> None:
            while not stop.wait(0.02):
                compactor.run_until_idle()

        thread = threading.Thread(target=compact)
        thread.start()
        try:
            for i in range(200):  # 40 KB through an 8 KB window
                db.put(b"more%04d" % i, b"y" * 200)
        finally:
            stop.set()
            thread.join()
        assert db._memtable.size_bytes < 8192 + 300
        assert db.get(b"more0000") == b"y" * 200 and db.get(b"key0000") == b"x" * 200


@LOCAL
def test_the_in_process_compactor_keeps_writes_flowing(backend: Backend) -> None:
    settings = tight(backend, compactor="in-process", compaction_interval=0.02)
    with Db.open(backend.target(), settings=settings) as db:
        for i in range(200):
            db.put(b"k%04d" % i, b"z" * 200)
        assert db._memtable.size_bytes < 8192 + 300
        assert len(list(db.scan())) == 200
