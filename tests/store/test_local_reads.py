"""``file://`` reads straight from the files: descriptors of compacted SSTs are kept open, a
bounded number, and never closed under a read that uses them."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from slatepy.store.local_read import LocalReads


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_descriptors_of_compacted_ssts_are_kept_bounded_and_closed(tmp_path: Path) -> None:
    (tmp_path / "compacted").mkdir()
    (tmp_path / "wal").mkdir()
    for i in range(10):
        (tmp_path / "compacted" / f"{i}.sst").write_bytes(b"%d" % i * 100)
    (tmp_path / "wal" / "1.sst").write_bytes(b"w" * 10)
    reads = LocalReads(str(tmp_path), "file://x", max_open=4)
    baseline = open_fds()
    for _ in range(2):
        for i in range(10):
            assert reads.get_ranges(f"compacted/{i}.sst", [(0, 2), (98, 101)]) == [
                b"%d" % i * 2,
                b"%d" % i * 2,
            ]
    assert open_fds() == baseline + 4  # the 4 most recent, no more
    assert reads.get_ranges("wal/1.sst", [(0, 3)]) == [b"www"]
    assert open_fds() == baseline + 4  # WAL SSTs (numbered names) are opened per read
    # A kept descriptor reads the object it opened even after the file is deleted (GC):
    # the reader's view still names it until it moves on.
    os.unlink(tmp_path / "compacted" / "9.sst")
    assert reads.get_ranges("compacted/9.sst", [(0, 1)]) == [b"9"]
    reads.close()
    assert open_fds() == baseline


def test_a_descriptor_evicted_during_a_read_is_closed_after_it(tmp_path: Path) -> None:
    (tmp_path / "compacted").mkdir()
    for i in range(3):
        (tmp_path / "compacted" / f"{i}.sst").write_bytes(bytes([i]) * (1 << 20))
    reads = LocalReads(str(tmp_path), "file://x", max_open=1)
    baseline = open_fds()
    errors: list[BaseException] = []

    def reader(i: int) -> None:
        try:
            for _ in range(200):
                (data,) = reads.get_ranges(f"compacted/{i}.sst", [(0, 1 << 20)])
                assert data == bytes([i]) * (1 << 20)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert open_fds() == baseline + 1
    reads.close()
    assert open_fds() == baseline
