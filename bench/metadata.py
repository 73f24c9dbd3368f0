"""A 10 TB database on paper (issue 33, item 5): the real metadata of 100,000 SSTs.

    python -m bench.metadata                       # 100,000 SSTs on file://
    python -m bench.metadata --ssts 10000

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
import json
import statistics
import subprocess
import sys
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


def run_sizes(total: int, ratio: int = 8) -> list[int]:
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


def sst_id(run: int, index: int) -> str:
    """32 hex digits like a real id (``uuid4().hex``), naming the run (0: L0) and index."""
    return f"{run:02x}{index:030x}"


def key_range(counts: list[int], name: str) -> tuple[int, int]:
    """The key range of the synthetic SST ``name`` in a layout of run ``counts``."""
    run, index = int(name[:2], 16), int(name[2:], 16)
    if run == 0:
        return 0, KEY_SPACE - 1
    width = KEY_SPACE // counts[run - 1]
    return index * width, (index + 1) * width - 1


def synthetic_layout(ssts: int) -> tuple[tuple[SstHandle, ...], tuple[SortedRun, ...]]:
    """``L0_SSTS`` L0 SSTs over the whole key space and size-tiered runs (ratio 8, above
    the planner's 4, so a compaction merges L0 with the small runs, as in a steady state)
    holding the rest, each partitioning the key space."""
    counts = run_sizes(ssts - L0_SSTS)
    l0 = tuple(handle(sst_id(0, i), 0, KEY_SPACE - 1) for i in range(L0_SSTS))
    runs = [
        SortedRun(
            run,
            tuple(handle(sst_id(run, i), *key_range(counts, sst_id(run, i))) for i in range(count)),
        )
        for run, count in enumerate(counts, start=1)
    ]
    return l0, tuple(reversed(runs))  # newest (smallest) first


class SyntheticSsts(WrappingStore):
    """Serves ``compacted/<id>.sst`` of the synthetic handles (built on first read, kept);
    counts every read request; everything else goes to ``inner``."""

    def __init__(self, inner: ObjectStore, counts: list[int]) -> None:
        super().__init__(inner)
        self._counts = counts
        self._built: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()

    def _sst(self, path: str) -> bytes | None:
        if not path.startswith("compacted/"):
            return None
        name = path.removeprefix("compacted/").removesuffix(".sst")
        with self._lock:
            data = self._built.get(name)
            if data is None:
                data = self._built[name] = synthetic_sst(*key_range(self._counts, name))
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
    """This process's peak RSS (``VmHWM``: unlike ``ru_maxrss``, which Linux carries over
    ``execve`` from the forking parent, it is this program's alone)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_child(url: str, who: str, ssts: int) -> dict[str, object]:
    """In a fresh process: open the writer or a reader over the synthetic store, then two
    gets; the process's peak RSS is the engine's alone (no bench-side copies)."""
    settings = Settings(compactor="off")
    store = SyntheticSsts(open_store(url, settings), run_sizes(ssts - L0_SSTS))
    start = time.perf_counter()
    db: Db | DbReader = (
        Db.open(store, settings=settings)
        if who == "writer"
        else DbReader.open(store, settings=settings)
    )
    open_s = time.perf_counter() - start
    opened = store.take()
    runs = run_sizes(ssts - L0_SSTS)
    low, _ = key_range(runs, sst_id(1, runs[0] // 2))
    probe = key(low)  # in the oldest run only: every newer source is passed on the way
    start = time.perf_counter()
    value = db.get(probe)
    get_s = time.perf_counter() - start
    cold = store.take()
    absent = db.get(key(low + 1))
    warm = store.take()
    db.close()
    assert value == b"v" * 100 and absent is None
    return {
        "open_s": open_s,
        "open_requests": opened,
        "get_s": get_s,
        "cold_get_requests": cold,
        "next_get_requests": warm,
        "peak_mb": peak_mb(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ssts", type=int, default=100_000)
    parser.add_argument("--backend", choices=["file", "memory"], default="file")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--child", choices=["writer", "reader"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(open_child(args.url, args.child, args.ssts)))
        return
    if args.backend == "memory":
        raise SystemExit("the open measures run in child processes: use --backend file")
    settings = Settings(compactor="off")
    with tempfile.TemporaryDirectory() as tmp:
        url = f"file://{tmp}/db"
        base = open_store(url, settings, create=True)
        Db.open(base, settings=settings).close()
        l0, runs = synthetic_layout(args.ssts)
        count = len(l0) + sum(len(r.ssts) for r in runs)
        rows: list[tuple[str, str]] = [
            ("SSTs (on paper)", f"{count:,} ({count * PAPER_SST_BYTES / 1e12:.1f} TB)"),
            ("layout", f"L0 {len(l0)}, runs {[len(r.ssts) for r in runs]}"),
        ]
        manifests = ManifestStore(base)
        current = manifests.load()
        assert current is not None
        manifest = msgspec.structs.replace(current.manifest, l0=l0, sorted_runs=runs)
        encoded, encode_s = timed(manifest.encode, args.repeat)
        _, decode_s = timed(lambda: Manifest.decode(encoded), args.repeat)
        rows += [
            ("manifest size", f"{len(encoded) / 2**20:.1f} MiB ({len(encoded) / count:.0f} B/SST)"),
            ("manifest encode / decode", f"{encode_s * 1e3:.0f} ms / {decode_s * 1e3:.0f} ms"),
        ]
        manifests.update(lambda m, _: msgspec.structs.replace(m, l0=l0, sorted_runs=runs))
        del manifest, current
        encoded = b""  # the bench's copies are not the engine's memory

        def bump(m: Manifest, _: int) -> Manifest:  # the smallest real change
            return msgspec.structs.replace(m, last_compacted_seq=m.last_compacted_seq + 1)

        # Cold: a fresh ManifestStore lists, reads and decodes first (a reader's renewal or
        # another process's update); warm: the latest is cached (the writer's own updates).
        _, cold_s = timed(lambda: ManifestStore(base).update(bump), args.repeat)
        latest = ManifestStore(base)
        latest.load()
        _, warm_s = timed(lambda: latest.update(bump), args.repeat)
        rows.append(
            ("manifest update (cold / warm)", f"{cold_s * 1e3:.0f} ms / {warm_s * 1e3:.0f} ms")
        )

        policy = CompactionPolicy()
        loaded = latest.load()
        assert loaded is not None
        done, plan_s = timed(lambda: plan(loaded.manifest, None, policy), args.repeat)
        assert isinstance(done, L0ToRun)
        merged = len(done.l0_ids) + sum(
            len(r.ssts) for r in loaded.manifest.sorted_runs if r.id in done.run_ids
        )
        outputs = tuple(handle(uuid_like(i), 0, KEY_SPACE - 1) for i in range(merged))
        _, publish_s = timed(
            lambda: apply_result(loaded.manifest, done, outputs, loaded.manifest.compactor_epoch),
            args.repeat,
        )
        rows.append(
            (
                "planner per compaction (plan / publish transition)",
                f"{plan_s * 1e3:.1f} ms / {publish_s * 1e3:.1f} ms "
                f"(merges {merged} SSTs: L0 and runs {list(done.run_ids)})",
            )
        )
        rows.append(("peak RSS of this process (builds the manifest)", f"{peak_mb():.0f} MB"))
        for who in ("writer", "reader"):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.metadata",
                    "--child",
                    who,
                    "--url",
                    url,
                    "--ssts",
                    str(args.ssts),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            cold = r["cold_get_requests"]
            rows += [
                (f"{who} open", f"{r['open_s']:.2f} s, requests {r['open_requests']}"),
                (
                    f"{who} cold get (key in the oldest run)",
                    f"{sum(cold.values())} requests {cold}",
                ),
                (
                    f"{who} next get (absent key, tops pinned)",
                    f"{sum(r['next_get_requests'].values())} requests",
                ),
                (f"{who} process peak RSS", f"{r['peak_mb']:.0f} MB"),
            ]
    print(f"| 10 TB on paper (file://, {args.ssts:,} SSTs) | |")
    print("|---|---|")
    for name, text in rows:
        print(f"| {name} | {text} |")


def uuid_like(index: int) -> str:
    return f"ff{index:030x}"


if __name__ == "__main__":
    main()
