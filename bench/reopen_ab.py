"""A/B of ``Settings.close_compaction_wait`` on the write-close-reopen-read workload (issue 33).

    python -m bench.reopen_ab 200000 3

slatepy with ``close_compaction_wait=0`` (close abandons a running compaction, as before
issue 33) and with the default, then rocksdict, interleaved, for the given keys and rounds
(:func:`bench.reopen_read.run_reopen`); prints each round, then medians, spreads and the
ratio to rocksdict in every round.
"""

import statistics
import sys
import tempfile
import uuid
from typing import Any

from bench.__main__ import key, per_1000, requests
from bench.reopen_read import run_reopen
from slatepy import Settings

BATCHES = "write: batches of 1000, awaited (rewrites)"


def main() -> None:
    keys, rounds = int(sys.argv[1]), int(sys.argv[2])
    variants = [
        ("abandon", Settings(close_compaction_wait=0)),
        ("wait", Settings()),
        ("rocksdict", Settings()),
    ]
    out: dict[str, list[dict[str, Any]]] = {v: [] for v, _ in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name, settings in variants:
                res = run_reopen(
                    "rocksdict" if name == "rocksdict" else "slatepy",
                    f"file://{tmp}/{name}-{uuid.uuid4().hex[:6]}",
                    settings,
                    keys,
                    key=key,
                    requests=requests,
                    per_1000=per_1000,
                )
                out[name].append(res)
                gets, scan = res["gets after reopen"], res["full scan after reopen"]
                reopen = res["close and reopen"]
                print(
                    f"round {r + 1} {name:9} close+reopen {reopen['seconds'] * 1000:7,.0f} ms "
                    f"{reopen.get('state', '')} | gets {gets['rate']:9,.0f}/s "
                    f"{gets['requests_per_1000']} | scan {scan['rate']:11,.0f} rows/s "
                    f"{scan['requests_per_1000']} | batches {res[BATCHES]['rate']:,.0f} rows/s",
                    flush=True,
                )
    for workload in ["close and reopen", "gets after reopen", "full scan after reopen"]:
        for name in ["abandon", "wait"]:
            mine = [x[workload]["rate"] for x in out[name]]
            rocks = [x[workload]["rate"] for x in out["rocksdict"]]
            ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(mine, rocks, strict=True))
            print(
                f"{workload:24} {name:8} median {statistics.median(mine):12,.1f} "
                f"[{min(mine):,.1f}-{max(mine):,.1f}] / rocksdict per round: {ratios}"
            )


if __name__ == "__main__":
    main()
