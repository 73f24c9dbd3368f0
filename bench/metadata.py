"""A 10 TB database on paper (issue 33, item 5): the real metadata of 100,000 SSTs.

    python -m bench.metadata                       # 100,000 SSTs on file://
    python -m bench.metadata --ssts 10000 --backend memory

The manifest is synthetic (4 overlapping L0 SSTs and size-tiered sorted runs, ratio 4,
that partition a key space of 10^11 keys; 100 MB and ~860,000 entries per SST on paper),
everything done with it is real: msgspec encode/decode, ``ManifestStore.update`` (the CAS
create of the next manifest, fsynced on ``file://``), the compaction planner and the
transition that publishes a compaction, ``Db.open`` (writer) and ``DbReader.open`` over a
store whose ``compacted/`` SSTs are synthesised on demand. A synthesised SST is a real SST
(footer, top-level index, bloom filter, blocks) of ``ENTRIES`` keys spread over its handle's
key range, so the reader's open and a cold get read and decode real bytes; its handle
records that object's real size (the manifest's on-paper 100 MB would not match the footer).
A cold get on real 100 MB SSTs also reads one index partition per SST whose filter it
reaches (the tail read holds only the top level then); the report says so.

Reports: manifest size, encode and decode time, manifest update time, planner time per
compaction (plan + publish transition), writer and reader open time and requests, requests
per cold get, and peak RSS. Targets: open <= 2 s, update <= 100 ms, memory <= 256 MB.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

import msgspec

from slatepy import Db, DbReader, Settings
from slatepy.compactor.planner import CompactionPolicy, L0ToRun, apply_result, plan
from slatepy.format.sst import SstBuilder
from slatepy.manifest.record import Manifest, SortedRun, SstHandle
from slatepy.manifest.store import ManifestStore
from slatepy.store import ObjectStore, open_store
from slatepy.store.base import ObjectMeta, PutData, PutMode, WrappingStore

T = TypeVar("T")

KEY_SPACE = 10**11
"""Keys ``key%013d`` below this: ~10 TB of 16-byte keys with 100-byte values."""
PAPER_SST_BYTES = 100 * 1000 * 1000
PAPER_ENTRIES = PAPER_SST_BYTES // 116
ENTRIES = 32
"""Entries of a synthesised SST (spread over its key range, first and last key included)."""
L0_SSTS = 4
SEQ = 10**9


def key(number: int) -> bytes:
    return b"key%013d" % number


def synthetic_sst(first: int, last: int) -> bytes:
    """A real SST of ``ENTRIES`` keys from ``first`` to ``last`` (deterministic)."""
    builder = SstBuilder(writer_epoch=1)
    step = (last - first) / (ENTRIES - 1)
    for i in range(ENTRIES):
        builder.add(key(first + round(i * step)), SEQ, b"v" * 100)
    return bytes(builder.finish().data)


SST_BYTES = len(synthetic_sst(0, KEY_SPACE - 1))


def run_sizes(total: int, ratio: int = 4) -> list[int]:
    """SST counts of size-tiered runs (oldest, largest first) adding up to ``total``."""
    sizes: list[int] = []
    left = total
    while left > 0:
        size = max(1, left - left // ratio) if left > ratio else left
        sizes.append(size)
        left -= size
    return sizes


def handle(sst_id: str, first: int, last: int) -> SstHandle:
    return SstHandle(
        id=sst_id,
        object_size=SST_BYTES,
        first_key=key(first),
        last_key=key(last),
        entry_count=PAPER_ENTRIES,
        max_seq=SEQ,
    )


def synthetic_layout(ssts: int) -> tuple[tuple[SstHandle, ...], tuple[SortedRun, ...]]:
    """``L0_SSTS`` L0 SSTs over the whole key space and runs holding the rest."""
    l0 = tuple(handle(f"l0-{i}", 0, KEY_SPACE - 1) for i in range(L0_SSTS))
    runs = []
    for run_id, count in enumerate(run_sizes(ssts - L0_SSTS), start=1):
        width = KEY_SPACE // count
        runs.append(
            SortedRun(
                run_id,
                tuple(
                    handle(f"r{run_id}-{i}", i * width, (i + 1) * width - 1) for i in range(count)
                ),
            )
        )
    return l0, tuple(reversed(runs))  # newest (smallest) first


class SyntheticSsts(WrappingStore):
    """Serves ``compacted/<id>.sst`` of the synthetic handles (built on first read, kept);
    counts every read request; everything else goes to ``inner``."""

    def __init__(self, inner: ObjectStore, handles: dict[str, SstHandle]) -> None:
        super().__init__(inner)
        self._handles = handles
        self._built: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()

    def _sst(self, path: str) -> bytes | None:
        name = path.removeprefix("compacted/").removesuffix(".sst")
        found = self._handles.get(name) if path.startswith("compacted/") else None
        if found is None:
            return None
        with self._lock:
            data = self._built.get(name)
            if data is None:
                first, last = int(found.first_key[3:]), int(found.last_key[3:])
                data = self._built[name] = synthetic_sst(first, last)
                assert len(data) == SST_BYTES
            return data

    def _count(self, kind: str, path: str) -> None:
        with self._lock:
            self.requests[f"{kind} {path.split('/', maxsplit=1)[0]}"] += 1

    def get(self, path: str) -> bytes:
        self._count("get", path)
        data = self._sst(path)
        return self.inner.get(path) if data is None else data

    def get_range(self, path: str, start: int, end: int) -> bytes:
        self._count("get_range", path)
        data = self._sst(path)
        return self.inner.get_range(path, start, end) if data is None else data[start:end]

    def get_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self._count("get_ranges", path)
        data = self._sst(path)
        if data is None:
            return self.inner.get_ranges(path, ranges)
        return [data[start:end] for start, end in ranges]

    def get_suffix(self, path: str, length: int) -> bytes:
        self._count("get_suffix", path)
        data = self._sst(path)
        return self.inner.get_suffix(path, length) if data is None else data[-length:]

    def head(self, path: str) -> ObjectMeta:
        self._count("head", path)
        return self.inner.head(path)

    def put(self, path: str, data: PutData, *, mode: PutMode = "overwrite") -> str | None:
        self._count("put", path)
        return self.inner.put(path, data, mode=mode)

    def list(self, prefix: str, *, offset: str | None = None) -> list[ObjectMeta]:
        self._count("list", prefix)
        return self.inner.list(prefix, offset=offset)

    def take(self) -> dict[str, int]:
        with self._lock:
            taken = dict(self.requests)
            self.requests.clear()
        return taken


def timed(fn: Callable[[], T], repeat: int = 1) -> tuple[T, float]:
    """``fn()``'s result and its median time in seconds over ``repeat`` calls."""
    times = []
    result: T
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ssts", type=int, default=100_000)
    parser.add_argument("--backend", choices=["file", "memory"], default="file")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    settings = Settings(compactor="off")
    with tempfile.TemporaryDirectory() as tmp:
        url = f"file://{tmp}/db" if args.backend == "file" else "memory://"
        base = open_store(url, settings, create=True)
        Db.open(base, settings=settings).close()
        l0, runs = synthetic_layout(args.ssts)
        handles = {h.id: h for h in (*l0, *(h for r in runs for h in r.ssts))}
        rows: list[tuple[str, str]] = [
            (
                "SSTs (on paper)",
                f"{len(handles):,} ({len(handles) * PAPER_SST_BYTES / 1e12:.1f} TB)",
            ),
            ("layout", f"L0 {len(l0)}, runs {[len(r.ssts) for r in runs]}"),
        ]

        manifests = ManifestStore(base)
        current = manifests.load()
        assert current is not None
        manifest = msgspec.structs.replace(current.manifest, l0=l0, sorted_runs=runs)
        encoded, encode_s = timed(manifest.encode, args.repeat)
        _, decode_s = timed(lambda: Manifest.decode(encoded), args.repeat)
        rows += [
            (
                "manifest size",
                f"{len(encoded) / 2**20:.1f} MiB ({len(encoded) / len(handles):.0f} B/SST)",
            ),
            ("manifest encode / decode", f"{encode_s * 1e3:.0f} ms / {decode_s * 1e3:.0f} ms"),
        ]
        manifests.update(lambda m, _: msgspec.structs.replace(m, l0=l0, sorted_runs=runs))

        def snapshot_update() -> None:  # the smallest real change: a reader's snapshot renewal
            fresh = ManifestStore(base)  # no cached manifest: read, decode, encode, create
            fresh.update(
                lambda m, _: msgspec.structs.replace(m, last_compacted_seq=m.last_compacted_seq + 1)
            )

        _, update_s = timed(snapshot_update, args.repeat)
        latest = ManifestStore(base)
        _, cached_update_s = timed(
            lambda: latest.update(
                lambda m, _: msgspec.structs.replace(m, last_compacted_seq=m.last_compacted_seq + 1)
            ),
            args.repeat,
        )
        rows.append(
            (
                "manifest update (cold / warm)",
                f"{update_s * 1e3:.0f} ms / {cached_update_s * 1e3:.0f} ms",
            )
        )

        policy = CompactionPolicy()
        loaded = latest.load()
        assert loaded is not None

        def plan_and_publish() -> Manifest:
            done = plan(loaded.manifest, None, policy)
            assert isinstance(done, L0ToRun)
            merged = [
                h for r in loaded.manifest.sorted_runs if r.id in done.run_ids for h in r.ssts
            ]
            outputs = tuple(
                handle(f"out-{i}", 0, KEY_SPACE - 1) for i in range(max(1, len(merged)))
            )
            return apply_result(loaded.manifest, done, outputs, loaded.manifest.compactor_epoch)

        _, plan_s = timed(plan_and_publish, args.repeat)
        rows.append(("planner + publish transition per compaction", f"{plan_s * 1e3:.1f} ms"))

        store = SyntheticSsts(base, handles)
        store.take()
        db, writer_open_s = timed(lambda: Db.open(store, settings=settings))
        writer_requests = store.take()
        db.close()
        store.take()
        reader, reader_open_s = timed(lambda: DbReader.open(store, settings=settings))
        reader_requests = store.take()
        oldest = runs[-1].ssts[len(runs[-1].ssts) // 2]
        probe = oldest.first_key  # present only in the oldest run: every newer source is passed
        value = reader.get(probe)
        get_requests = store.take()
        absent = reader.get(key(int(probe[3:]) + 1))
        absent_requests = store.take()
        reader.close()
        assert value == b"v" * 100 and absent is None
        rows += [
            ("writer open", f"{writer_open_s:.2f} s, requests {writer_requests}"),
            ("reader open", f"{reader_open_s:.2f} s, requests {reader_requests}"),
            (
                "cold get, key in the oldest run",
                f"{sum(get_requests.values())} requests {get_requests}",
            ),
            (
                "next get, absent key (tops pinned)",
                f"{sum(absent_requests.values())} requests {absent_requests}",
            ),
            ("peak RSS", f"{peak_mb():.0f} MB"),
        ]
    print(f"| 10 TB on paper ({args.backend}://, {args.ssts:,} SSTs) | |")
    print("|---|---|")
    for name, text in rows:
        print(f"| {name} | {text} |")


if __name__ == "__main__":
    main()
