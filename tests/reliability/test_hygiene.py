"""Opening and closing must leave nothing behind: threads, file descriptors, memory."""

from __future__ import annotations

import gc
import os
import sys
import threading
from pathlib import Path

from slatepy import Db, DbReader, Settings


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_200_open_close_cycles_leak_nothing(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/db"
    settings = Settings(compaction_interval=0.01, reader_poll_interval=0.01)

    def cycle(i: int) -> None:
        with Db.open(url, settings=settings) as db:  # the in-process compactor runs too
            db.put(b"k%03d" % (i % 50), b"v" * 100)
            with DbReader.open(url, settings=settings) as reader:
                reader.get(b"k000")

    for i in range(20):  # warm up caches, imports, thread pools
        cycle(i)
    gc.collect()
    # Threads of earlier tests may still end meanwhile (a two-phase store's completer pool
    # exits once collected): a leak is a thread that was not there before.
    threads, fds = set(threading.enumerate()), open_fds()
    blocks = sys.getallocatedblocks()
    for i in range(200):
        cycle(i)
    gc.collect()
    grown = sys.getallocatedblocks() - blocks
    leaked = [t.name for t in threading.enumerate() if t not in threads]
    assert not leaked, leaked
    assert open_fds() <= fds
    # A leak of one object per cycle would be 200+; allow for caches filling up.
    assert grown < 2000, f"{grown} more memory blocks allocated after 200 cycles"
