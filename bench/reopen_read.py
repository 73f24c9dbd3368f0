"""The write-close-reopen-read workload of issue 33, for ``python -m bench --workload reopen``.

What a service does across a restart: write the keys (unawaited puts, then awaited batches of
1,000 rewriting them), close, reopen, then read: random gets and a full scan. What the reads
cost depends on the state ``close()`` left (memtable replay, L0 SSTs, sorted runs), so the
state after the reopen is reported next to the times (slatepy only: L0 SSTs, sorted runs,
memtable entries). Each engine is driven as in :mod:`bench.engines`; with ``--repeat 3`` the
engines run interleaved and every figure is the median, with the spread of the runs.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from bench.engines import ENGINES
from bench.proxy import LatencyProxy
from slatepy import Settings

GETS = 10_000
VALUE = b"v" * 100
REWRITTEN = b"w" * 100


def slatepy_state(engine: Any) -> str | None:
    """Where a reopened slatepy database's data is: L0 SSTs, sorted runs, memtable."""
    db = getattr(engine, "db", None)
    view = getattr(db, "_view", None)
    if view is None:
        return None
    runs = len(view.sorted_runs)
    return f"L0 {len(view.l0)}, runs {runs}, memtable {len(db._memtable):,}"  # type: ignore[union-attr]


def run_reopen(
    engine_name: str,
    url: str,
    settings: Settings,
    keys: int,
    *,
    key: Callable[[int], bytes],
    requests: Callable[[Any], dict[str, int]],
    per_1000: Callable[[dict[str, int], dict[str, int], int], dict[str, float]],
    proxy: LatencyProxy | None = None,
) -> dict[str, Any]:
    """The workload on one engine: each phase's rate, its requests per 1,000 operations
    (slatepy's store metrics; the proxy's too behind one) and, after the reopen, the state."""
    rng = random.Random(1)
    all_keys = [key(i) for i in range(keys)]
    sample = rng.sample(all_keys, min(keys, GETS))
    results: dict[str, Any] = {}
    engine = ENGINES[engine_name](url, settings)

    def measure(name: str, ops: int, fn: Callable[[], Any], unit: str) -> Any:
        before = requests(engine)
        seen = proxy.counts() if proxy else {}
        start = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - start
        results[name] = {
            "rate": ops / elapsed,
            "unit": unit,
            "seconds": elapsed,
            "requests_per_1000": per_1000(before, requests(engine), ops),
        }
        if proxy:
            results[name]["proxy_requests_per_1000"] = per_1000(seen, proxy.counts(), ops)
        return out

    try:
        measure(
            "write: puts (not awaited)", keys, lambda: engine.put_many(all_keys, VALUE), "ops/s"
        )
        measure(
            "write: batches of 1000, awaited (rewrites)",
            keys,
            lambda: engine.batches(all_keys, REWRITTEN, 1000, True),
            "rows/s",
        )
        # The close and the open are timed together; requests are the new writer's only.
        start = time.perf_counter()
        engine.reopen()
        elapsed = time.perf_counter() - start
        results["close and reopen"] = {
            "rate": 1 / elapsed,
            "unit": f"per s ({elapsed * 1000:,.0f} ms)",
            "seconds": elapsed,
            "requests_per_1000": {},
        }
        state = slatepy_state(engine)
        if state:
            results["close and reopen"]["state"] = state
        found = measure("gets after reopen", len(sample), lambda: engine.get_many(sample), "ops/s")
        assert found == len(sample), (engine_name, found)
        rows = measure("full scan after reopen", keys, engine.scan_all, "rows/s")
        assert rows == keys, (engine_name, rows)
    finally:
        engine.close()
    return results
