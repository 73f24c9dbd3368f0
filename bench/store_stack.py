"""CPU per block read through the read stack a ``Db`` builds on ``file://``, layer by layer
(issue 33; RFC 0006's "store stack" addendum).

    python -m bench.store_stack --keys 200000 [--dir /tmp/store-stack]

Writes ``--keys`` keys (16-byte keys, 100-byte values) and closes, as the reopen workload
does, then times 4 KiB reads at 20,000 random aligned offsets of the largest SST: through
the stack's shortcut for a kept descriptor (``KeptReads``, what a cold get reads with), and
``get_range`` from each layer of ``open_stack(with_external(...))`` down to ``os.pread`` (the best
and the median of 5 passes, ``time.process_time``), and the CPU per ``Db.get`` of 10,000
random keys in a freshly opened database (the first pass: about half miss the block cache).
Runs against whatever ``slatepy`` is importable (``PYTHONPATH`` picks the tree).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from slatepy import Db, Settings
from slatepy.engine.clone import with_external
from slatepy.store import ObjectStore, open_store
from slatepy.store.stack import open_stack

VALUE = b"v" * 100
PASSES = 5


def key(i: int) -> bytes:
    return f"{i:016d}".encode()


def build(root: Path, keys: int) -> None:
    db = Db.open(open_store(f"file://{root}", Settings(), create=True), settings=Settings())
    for i in range(keys):
        db.put(key(i), VALUE, await_durable=False)
    db.flush()
    db.close()


def per_call_us(calls: list[int], fn: Callable[[int], object]) -> tuple[float, float]:
    """Best and median CPU microseconds per ``fn(offset)`` over ``PASSES`` passes."""
    passes = []
    for _ in range(PASSES):
        start = time.process_time()
        for offset in calls:
            fn(offset)
        passes.append((time.process_time() - start) / len(calls) * 1e6)
    return min(passes), statistics.median(passes)


def layers(root: Path) -> None:
    settings = Settings()
    top = open_stack(with_external(open_store(f"file://{root}", settings), settings), settings)
    meta = max(top.list("compacted/"), key=lambda m: m.size)
    rng = random.Random(1)
    offsets = [rng.randrange(0, meta.size - 8192) & ~4095 for _ in range(20_000)]
    kept = getattr(top, "kept_reads", lambda path: None)(meta.path)  # absent before issue 33
    if kept is not None:
        top.get_range(meta.path, 0, 4096)  # keeps the descriptor
        read_kept = kept.read
        best, median = per_call_us(offsets, lambda o: read_kept(meta.path, o, o + 4096))
        print(f"{'KeptReads':16} {best:6.2f} µs best, {median:6.2f} median (a cold get's read)")
    layer: ObjectStore | None = top
    while layer is not None:
        read = layer.get_range
        best, median = per_call_us(offsets, lambda o, read=read: read(meta.path, o, o + 4096))
        print(f"{type(layer).__name__:16} {best:6.2f} µs best, {median:6.2f} median")
        layer = getattr(layer, "inner", None)
    fd = os.open(root / meta.path, os.O_RDONLY)
    try:
        best, median = per_call_us(offsets, lambda o: os.pread(fd, 4096, o))
    finally:
        os.close(fd)
    print(f"{'os.pread':16} {best:6.2f} µs best, {median:6.2f} median")


def cold_gets(root: Path, keys: int) -> None:
    rng = random.Random(2)
    sample = [key(rng.randrange(keys)) for _ in range(10_000)]
    cold = []
    for _ in range(3):
        db = Db.open(open_store(f"file://{root}", Settings()), settings=Settings())
        get = db.get
        start = time.process_time()
        for k in sample:
            get(k)
        cold.append((time.process_time() - start) / len(sample) * 1e6)
        db.close()
    shown = ", ".join(f"{c:.1f}" for c in cold)
    print(f"cold Db.get: {shown} µs CPU (median {statistics.median(cold):.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--dir", type=Path, help="reuse (or build) the database here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = (args.dir or Path(scratch) / "db").resolve()
        if not (root / "manifest").is_dir():
            build(root, args.keys)
        layers(root)
        cold_gets(root, args.keys)


if __name__ == "__main__":
    main()
