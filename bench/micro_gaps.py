"""Per-call costs behind slatepy's gaps to rocksdict (issue 16), with ``time.perf_counter``
and no profiler: each number is the median of ``--repeat`` timings.

    python -m bench.micro_gaps --keys 100000

Prints microseconds per operation (or per 1,000-entry batch) for slatepy's public calls,
the pieces they are made of (validation, WAL append, memtable, SST encode, fsync, block
decode, generator layers) and rocksdict's equivalent, on a local directory. The compactor
is off so that memtable gets stay in the memtable.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from slatepy import Db, Settings, WriteBatch
from slatepy.engine.batch import check_key, check_value
from slatepy.format.block import BlockBuilder, decode_block
from slatepy.format.sst import SstBuilder
from slatepy.store import open_store

VALUE = b"v" * 100


def key(i: int) -> bytes:
    return b"key%013d" % i


def timed(fn: Callable[[], Any], ops: int, repeat: int) -> float:
    """Median microseconds per operation of ``fn`` (which does ``ops`` operations)."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) / ops * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n, rep = args.keys, args.repeat
    keys = [key(i) for i in range(n)]
    batch_keys = keys[:1000]
    rows: list[tuple[str, float]] = []

    def row(name: str, us: float) -> None:
        rows.append((name, us))
        print(f"{us:10.3f} us  {name}", flush=True)

    from rocksdict import Rdict, WriteOptions
    from rocksdict import WriteBatch as RocksBatch

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(compactor="off")
        db = Db.open(open_store(f"file://{tmp}/slatepy", settings, create=True), settings=settings)
        rocks = Rdict(f"{tmp}/rocks")
        sync = WriteOptions()
        sync.sync = True

        # -- unawaited puts ------------------------------------------------------------
        def slate_puts() -> None:
            for k in keys:
                db.put(k, VALUE, await_durable=False)

        def rocks_puts() -> None:
            for k in keys:
                rocks.put(k, VALUE)

        def validation() -> None:
            for k in keys:
                (check_key(k), check_value(VALUE))

        plain: dict[bytes, tuple[int, bytes]] = {}

        def dict_puts() -> None:
            for k in keys:
                plain[k] = (1, VALUE)

        row("put: Db.put(await_durable=False)", timed(slate_puts, n, rep))
        row("put: rocksdict put (default WriteOptions)", timed(rocks_puts, n, rep))
        row("put: check_key + check_value only", timed(validation, n, rep))
        row("put: a dict store of (seq, value), the floor", timed(dict_puts, n, rep))
        db.flush()

        # -- gets -----------------------------------------------------------------------
        sample = keys[: min(n, 10_000)]
        row(
            "get: Db.get, memtable hit",
            timed(lambda: [db.get(k) for k in sample], len(sample), rep),
        )
        row("get: rocksdict get", timed(lambda: [rocks.get(k) for k in sample], len(sample), rep))
        row("get: check_key only", timed(lambda: [check_key(k) for k in sample], len(sample), rep))
        row("get: Db.get_many (one call)", timed(lambda: db.get_many(sample), len(sample), rep))
        row(
            "get: rocksdict get(list) (one call)",
            timed(lambda: rocks.get(sample), len(sample), rep),
        )

        # -- batches of 1,000, awaited ------------------------------------------------------
        def build() -> WriteBatch:
            batch = WriteBatch()
            for k in batch_keys:
                batch.put(k, VALUE)
            return batch

        built = [build() for _ in range(rep)]
        row("batch: build a WriteBatch of 1,000", timed(build, 1, rep))
        row("batch: Db.write(batch) awaited, 1,000", timed(lambda: db.write(built.pop()), 1, rep))

        def rocks_batch() -> None:
            batch = RocksBatch()
            for k in batch_keys:
                batch.put(k, VALUE)
            rocks.write(batch, sync)

        row("batch: rocksdict WriteBatch + write(sync=True), 1,000", timed(rocks_batch, 1, rep))

        def encode_add() -> bytes:
            builder = SstBuilder(writer_epoch=1, bloom_bits_per_key=0)
            for i, k in enumerate(batch_keys):
                builder.add(k, i, VALUE)
            return bytes(builder.finish().data)

        def encode_extend() -> bytes:
            builder = SstBuilder(writer_epoch=1, bloom_bits_per_key=0)
            builder.extend(batch_keys, list(range(1000)), [VALUE] * 1000)
            return bytes(builder.finish().data)

        assert encode_add() == encode_extend()
        row("batch: WAL SST encode, SstBuilder.add x1,000 + finish", timed(encode_add, 1, rep))
        row("batch: WAL SST encode, SstBuilder.extend + finish", timed(encode_extend, 1, rep))
        data = encode_add()
        counter = iter(range(10**9))

        def write_fsync() -> None:
            path = f"{tmp}/raw-{next(counter)}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            os.write(fd, data)
            os.fsync(fd)
            os.close(fd)

        def write_fsync_dir() -> None:
            write_fsync()
            dfd = os.open(tmp, os.O_RDONLY)
            os.fsync(dfd)
            os.close(dfd)

        row(f"batch: raw create + write {len(data):,} B + fsync", timed(write_fsync, 1, rep))
        row("batch: the same + fsync of the directory", timed(write_fsync_dir, 1, rep))

        # -- scans ----------------------------------------------------------------------------
        rocks.flush(True)
        total = sum(1 for _ in db.scan())
        row(
            f"scan: Db.scan, memtable only, per row ({total:,})",
            timed(lambda: sum(1 for _ in db.scan()), total, rep),
        )
        rtotal = sum(1 for _ in rocks.items())
        row(
            f"scan: rocksdict items(), per row ({rtotal:,})",
            timed(lambda: sum(1 for _ in rocks.items()), rtotal, rep),
        )
        entries = [(k, 1, VALUE) for k in keys]

        def layers(depth: int) -> int:
            it: Iterator[Any] = iter(entries)
            for _ in range(depth):
                it = (e for e in it)
            return sum(1 for _ in it)

        row("scan: 1 generator layer over tuples, per row", timed(lambda: layers(1), n, rep))
        row("scan: 5 generator layers over tuples, per row", timed(lambda: layers(5), n, rep))
        db.close()
        rocks.close()

    # Blocks decoded as a scan decodes them, per entry (4 KiB blocks of 100-byte values).
    blocks: list[bytes] = []
    for first in range(0, 1000, 30):
        bb = BlockBuilder()
        for i, k in enumerate(batch_keys[first : first + 30]):
            bb.add(k, i, VALUE)
        blocks.append(bytes(bb.finish()))
    entries_in = sum(len(decode_block(b).keys) for b in blocks)
    row(
        "scan: decode_block (parse + checksum), per entry",
        timed(lambda: [decode_block(b) for b in blocks], entries_in, rep),
    )


if __name__ == "__main__":
    main()
