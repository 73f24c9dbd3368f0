"""Random gets and a full scan on one sorted run, at the SST-reader level (RFC 0009).

    python -m bench.sst_reads --keys 2000000 --dir /tmp/sst-bench [--gets 20000]

Builds one sorted run of N keys (16-byte keys, 100-byte values) as 64 MB SSTs on the file
store (``SstBuilder`` directly, as compaction writes them; no WAL, no compactor), publishes it
in a manifest, then in a fresh state: 20,000 random gets through ``get_compacted`` (what
``Db.get`` does after its memtable) and a full scan, counting gets/s, store requests and the
index/filter decodes they cost. Runs against whatever ``slatepy`` is importable, so the same
script measures the code before RFC 0009 (``PYTHONPATH`` at a worktree of the old commit):
there it counts whole-SST meta decodes, here partition decodes.

Reader configurations: ``default`` is ``TableReader(store)`` as ``Db`` and ``DbReader``
construct it; ``settings`` sizes the caches from ``Settings`` (only after RFC 0009).
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import resource
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec

from slatepy.compactor.outputs import store_sst
from slatepy.config import Settings
from slatepy.engine.view import get_compacted, scan_merged
from slatepy.format.sst import SstBuilder
from slatepy.manifest.record import Manifest, SortedRun, SstHandle
from slatepy.manifest.store import ManifestStore
from slatepy.store import MetricsStore, open_store

try:  # the SST reader is in slatepy.table since issue 13; older measured code has it in engine
    import slatepy.table.reader as table_module
except ImportError:
    import slatepy.engine.table as table_module  # type: ignore[no-redef]
TableReader = table_module.TableReader

TARGET_SST_BYTES = 64 * 1024 * 1024


def key(i: int) -> bytes:
    return b"key%013d" % i


def value(i: int) -> bytes:
    return (b"%016d" % i) * 6 + b"vvvv"


def build(url: str, keys: int) -> float:
    """Write the sorted run and its manifest; return seconds taken."""
    started = time.perf_counter()
    store = open_store(url, Settings(file_sync="off"), create=True)
    handles: list[SstHandle] = []
    builder: SstBuilder | None = None

    def finish(b: SstBuilder) -> None:
        handles.append(store_sst(store, b.finish()))

    for i in range(keys):
        if builder is None:
            builder = SstBuilder(writer_epoch=0)
        builder.add(key(i), i + 1, value(i))
        if builder.estimated_size >= TARGET_SST_BYTES:
            finish(builder)
            builder = None
    if builder is not None:
        finish(builder)
    run = SortedRun(1, tuple(handles))
    ManifestStore(store).update(
        lambda m, _: msgspec.structs.replace(
            m, sorted_runs=(run,), last_compacted_seq=keys, writer_epoch=1
        )
    )
    return time.perf_counter() - started


class DecodeCounter:
    """Counts index decodes: the old whole-SST ``decode_meta``, or the new reader's stats."""

    def __init__(self) -> None:
        self.count = 0
        old = getattr(table_module, "decode_meta", None)
        if old is not None:

            def counting(*args: Any) -> Any:
                self.count += 1
                return old(*args)

            table_module.decode_meta = counting  # type: ignore[attr-defined]

    def decodes(self, tables: TableReader) -> int:
        stats = getattr(tables, "stats", None)
        return self.count if stats is None else stats().partitions_decoded


def reader(store: MetricsStore, config: str) -> TableReader:
    if config == "default":
        return TableReader(store)
    s = Settings()
    return TableReader(
        store,
        block_cache_bytes=s.block_cache_bytes,
        meta_cache_bytes=s.meta_cache_bytes,
        scan_read_ahead_bytes=s.scan_read_ahead_bytes,
    )


def measure(url: str, keys: int, gets: int, config: str, counter: DecodeCounter) -> dict[str, Any]:
    store = MetricsStore(open_store(url))
    manifest: Manifest = ManifestStore(store).load().manifest  # type: ignore[union-attr]
    tables = reader(store, config)
    store.metrics.reset()
    rng = random.Random(42)
    sample = [rng.randrange(keys) for _ in range(gets)]
    decodes = counter.decodes(tables)
    started = time.perf_counter()
    for i in sample:
        found = get_compacted(tables, manifest, key(i))
        assert found is not None and found[1] == value(i), i
    elapsed = time.perf_counter() - started
    get_metrics = store.metrics.snapshot().get("get_range")
    result: dict[str, Any] = {
        "config": config,
        "ssts": sum(len(r.ssts) for r in manifest.sorted_runs),
        "gets_per_s": round(gets / elapsed),
        "get_range_requests": get_metrics.requests if get_metrics else 0,
        "get_bytes_read": get_metrics.bytes_in if get_metrics else 0,
        "index_decodes": counter.decodes(tables) - decodes,
    }
    # Warm pass over the same keys.
    store.metrics.reset()
    started = time.perf_counter()
    for i in sample:
        get_compacted(tables, manifest, key(i))
    result["warm_gets_per_s"] = round(gets / (time.perf_counter() - started))
    result["warm_requests"] = store.metrics.requests("get_range")
    # A full scan with a cold reader.
    tables = reader(store, config)
    store.metrics.reset()
    started = time.perf_counter()
    rows = sum(1 for _ in scan_merged(tables, [], manifest, b"", None))
    elapsed = time.perf_counter() - started
    assert rows == keys, rows
    result["scan_rows_per_s"] = round(rows / elapsed)
    result["scan_requests"] = store.metrics.requests("get_range")
    if hasattr(tables, "stats"):
        stats = tables.stats()
        result["pinned_bytes_after_scan"] = stats.pinned_bytes
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--gets", type=int, default=20_000)
    parser.add_argument("--dir", default="/tmp/slatepy-sst-bench")
    parser.add_argument("--keep", action="store_true", help="reuse a database already built")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    root = Path(args.dir)
    url = f"file://{root.resolve()}"
    build_s = None
    if not (args.keep and root.exists()):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        build_s = round(build(url, args.keys), 1)
    counter = DecodeCounter()
    new_api = "meta_cache_bytes" in inspect.signature(TableReader.__init__).parameters
    configs = ["default", "settings"] if new_api else ["default"]
    results = {
        "slatepy": str(Path(table_module.__file__).parent.parent),
        "keys": args.keys,
        "build_s": build_s,
        "runs": [measure(url, args.keys, args.gets, c, counter) for c in configs],
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
