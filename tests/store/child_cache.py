"""A second process on a shared disk cache (``python -m tests.store.child_cache CONFIG``).

CONFIG is JSON with ``url``, ``cache_dir``, ``max_bytes``, ``part_size`` and ``mode``:

* ``"read"``: read ``reads`` (``[path, start, end]`` triples) once through the cache.
* ``"hammer"``: for ``seconds``, read random ranges of ``objects`` (``[path, size]``; the
  contents are :func:`content`) and check every byte, while the parent does the same.

Prints one JSON line: ``digests`` of the reads (``read``), ``bad`` reads (``hammer``),
``requests`` by kind and the ``cache`` counters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
import time
from typing import Any

from slatepy.store import open_store
from slatepy.store.disk_cache import DiskCache, DiskCachedStore


def content(path: str, size: int) -> bytes:
    """The bytes of test object ``path`` (the same in every process)."""
    return random.Random(path).randbytes(size)


def cached_store(config: dict[str, Any]) -> DiskCachedStore:
    return DiskCachedStore(
        open_store(config["url"]),
        DiskCache(config["cache_dir"], config["max_bytes"]),
        namespace=config["url"],
        part_size=config["part_size"],
    )


def hammer(store: DiskCachedStore, objects: list[list[Any]], seconds: float, seed: int) -> int:
    """Random reads for ``seconds``; returns how many returned wrong bytes."""
    rng = random.Random(seed)
    expected = {path: content(path, size) for path, size in objects}
    bad = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        path, size = rng.choice(objects)
        start = rng.randrange(size)
        end = min(size, start + rng.randrange(1, 4 * store.part_size))
        if store.get_range(path, start, end) != expected[path][start:end]:
            bad += 1
    return bad


def main() -> None:
    config = json.loads(sys.argv[1])
    store = cached_store(config)
    out: dict[str, Any] = {}
    if config["mode"] == "read":
        out["digests"] = [
            hashlib.sha256(store.get_range(path, start, end)).hexdigest()
            for path, start, end in config["reads"]
        ]
    else:
        out["bad"] = hammer(store, config["objects"], config["seconds"], config["seed"])
    out["requests"] = {k: v.requests for k, v in store.metrics.snapshot().items()}
    out["cache"] = dataclasses.asdict(store.metrics.cache_snapshot())
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
