"""Per-block compression: size against speed for none, lz4 and zstd (RFC 0018).

    python -m bench.compression [--keys 200000] [--gets 20000] [--out bench/results/compression]

For each codec, on a fresh ``file://`` database (``file_sync="off"``, so the numbers are the
CPU cost of encoding and compressing, not the disk's fsync latency; compactor off):

* **write**: ``--keys`` puts (16-byte keys, 100-byte values, in random order) as batches of
  100 through ``Db.write`` without awaiting each, then ``flush``: WAL SSTs encoded (and
  compressed) on the write path.
* **compact**: the WAL compacted to L0 and L0 into one sorted run by a ``Compactor``: every
  compacted SST written (and compressed) once more.
* **size**: bytes of the sorted run's SSTs (and of the WAL SSTs), and the ratio to ``none``.
* **get**: ``--gets`` random point gets on a freshly opened ``DbReader`` (cold caches: every
  block read is decompressed once), then the same gets again (warm: cached, decoded).
* **scan**: a full scan on another freshly opened reader (every block decompressed).
* **durable puts**: ``--durable`` single puts, each awaited (one WAL SST of one entry each),
  on a ``memory://`` store: the per-WAL-SST cost of compression with no I/O latency to hide it.

The codecs take turns for ``--repeat`` rounds and each throughput is the best of its rounds:
the machine this was written on is shared, and the best run is the least disturbed one.

Values are "realistic, partly compressible": a JSON-like record of a few fields drawn from
small vocabularies (compresses well) with a random base64 token of 32 characters and a random
float (which do not).
"""

from __future__ import annotations

import argparse
import base64
import json
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from slatepy import Db, DbReader, Settings, WriteBatch
from slatepy.compactor import CompactionPolicy, Compactor
from slatepy.manifest.store import ManifestStore
from slatepy.store import open_store
from slatepy.table.layout import compacted_path

CODECS = ("none", "lz4", "zstd")
BATCH = 100
VALUE_SIZE = 100
_STATUSES = (b"active", b"pending", b"closed", b"suspended")
_COUNTRIES = (b"DE", b"FR", b"US", b"JP", b"BR", b"IN", b"GB", b"NL")
_PLANS = (b"free", b"pro", b"team", b"enterprise")


def key(i: int) -> bytes:
    """16 bytes."""
    return b"user:%011d" % i


def value(i: int) -> bytes:
    """100 bytes: repetitive structure plus a random token and a random number."""
    rng = random.Random(i)
    record = b'{"id":%d,"st":"%s","cc":"%s","plan":"%s","score":%.6f,"tok":"%s"}' % (
        i,
        rng.choice(_STATUSES),
        rng.choice(_COUNTRIES),
        rng.choice(_PLANS),
        rng.random(),
        base64.b64encode(rng.randbytes(24)),
    )
    return record.ljust(VALUE_SIZE, b" ")[:VALUE_SIZE]


def sizes(url: str, settings: Settings) -> dict[str, int]:
    store = open_store(url, settings)
    stored = ManifestStore(store).load()
    assert stored is not None
    run_bytes = sum(
        store.head(compacted_path(h.id)).size for r in stored.manifest.sorted_runs for h in r.ssts
    )
    wal_bytes = sum(m.size for m in store.list("wal/"))
    return {"sorted_run_bytes": run_bytes, "wal_bytes": wal_bytes}


def measure(codec: str, keys: int, gets: int, durable: int, root: Path) -> dict[str, Any]:
    url = f"file://{root / codec}"
    settings = Settings(compression=codec, compactor="off", file_sync="off")  # type: ignore[arg-type]
    order = list(range(keys))
    random.Random(7).shuffle(order)
    values = {i: value(i) for i in order}
    result: dict[str, Any] = {"codec": codec}

    started = time.perf_counter()
    with Db.open(url, settings=settings) as db:
        for start in range(0, keys, BATCH):
            batch = WriteBatch()
            for i in order[start : start + BATCH]:
                batch.put(key(i), values[i])
            db.write(batch, await_durable=False)
        db.flush()
    result["write_keys_per_s"] = round(keys / (time.perf_counter() - started))

    store = open_store(url, settings)
    wal_bytes = sum(m.size for m in store.list("wal/"))
    started = time.perf_counter()
    compactor = Compactor(store, settings=settings, policy=CompactionPolicy(l0_trigger=1))
    while compactor.run_once() is not None:
        pass
    result["compact_keys_per_s"] = round(keys / (time.perf_counter() - started))
    result.update(sizes(url, settings))
    result["wal_bytes"] = wal_bytes

    rng = random.Random(42)
    sample = [rng.randrange(keys) for _ in range(gets)]
    with DbReader.open(url, settings=settings, read_only=True) as reader:
        started = time.perf_counter()
        for i in sample:
            assert reader.get(key(i)) == values[i]
        result["cold_gets_per_s"] = round(gets / (time.perf_counter() - started))
        started = time.perf_counter()
        for i in sample:
            reader.get(key(i))
        result["warm_gets_per_s"] = round(gets / (time.perf_counter() - started))
    with DbReader.open(url, settings=settings, read_only=True) as reader:
        started = time.perf_counter()
        rows = sum(1 for _ in reader.scan())
        result["scan_rows_per_s"] = round(rows / (time.perf_counter() - started))
        assert rows == keys, rows
    store = open_store("memory://")
    with Db.open(store, settings=settings) as db:
        started = time.perf_counter()
        for i in range(durable):
            db.put(key(i), values[order[i % keys]])
        result["durable_puts_per_s"] = round(durable / (time.perf_counter() - started))
    return result


def table(results: list[dict[str, Any]], keys: int) -> str:
    base = next(r for r in results if r["codec"] == "none")
    lines = [
        f"# bench.compression: {keys:,} keys (16 B keys, 100 B values), file store, file_sync=off",
        "",
        "| codec | sorted run MB | ratio | WAL MB | write keys/s | compact keys/s "
        "| cold gets/s | warm gets/s | scan rows/s | durable puts/s (memory) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = base["sorted_run_bytes"] / r["sorted_run_bytes"]
        lines.append(
            f"| {r['codec']} | {r['sorted_run_bytes'] / 1e6:.1f} | {ratio:.2f}x "
            f"| {r['wal_bytes'] / 1e6:.1f} | {r['write_keys_per_s']:,} "
            f"| {r['compact_keys_per_s']:,} | {r['cold_gets_per_s']:,} "
            f"| {r['warm_gets_per_s']:,} | {r['scan_rows_per_s']:,} "
            f"| {r['durable_puts_per_s']:,} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--gets", type=int, default=20_000)
    parser.add_argument("--durable", type=int, default=2_000, help="awaited single puts")
    parser.add_argument("--codecs", nargs="+", default=list(CODECS), choices=CODECS)
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds over the codecs; the best of each is kept"
    )
    parser.add_argument("--out", help="write <out>.json and <out>.md")
    args = parser.parse_args()
    best: dict[str, dict[str, Any]] = {}
    for round_ in range(args.repeat):
        for codec in args.codecs:
            with tempfile.TemporaryDirectory(prefix="slatepy-compression-") as tmp:
                run = measure(codec, args.keys, args.gets, args.durable, Path(tmp))
            print(f"round {round_ + 1}: {json.dumps(run)}", flush=True)
            kept = best.setdefault(codec, run)
            for name, number in run.items():
                if name.endswith("_per_s"):
                    kept[name] = max(kept[name], number)
    results = [best[c] for c in args.codecs]
    text = table(results, args.keys) if "none" in args.codecs else json.dumps(results)
    print(text)
    if args.out:
        meta = {"keys": args.keys, "gets": args.gets, "python": platform.python_version()}
        Path(args.out + ".json").write_text(json.dumps({**meta, "runs": results}, indent=2))
        Path(args.out + ".md").write_text(text)


if __name__ == "__main__":
    main()
