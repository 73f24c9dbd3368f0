"""Transactions per second of SlateDB's Python package (``slatedb`` 0.17), on the file store,
for comparison with slatepy's ``db.begin()`` once it exists (issue 16: slatepy >= 10x).

    python -m bench.txn_slatedb --accounts 1000 --txns 2000

Workload: read-modify-write transfers. Each transaction reads two random accounts (8-byte
little-endian balances), moves 1 from one to the other, writes both and commits. Three
ways: one task, commits not awaited (``commit()`` returns once the transaction is applied);
one task, each commit awaited durable (``await_durable`` on its handle: SlateDB flushes its
WAL on a timer, so this is bound by that tick); and ``--workers`` concurrent tasks with
unawaited commits, where conflicting transactions fail at commit and are retried (the retries
are counted). The sum of balances is checked at the end. Isolation: ``--isolation`` snapshot
(default) or serializable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
BALANCE = struct.Struct("<q")
START = 1_000


def account(i: int) -> bytes:
    return b"acct%012d" % i


async def transfer(db: Any, level: Any, rng: random.Random, accounts: int, durable: bool) -> int:
    """One transfer, retried until it commits; returns the number of conflicts met."""
    from slatedb.uniffi import Error

    conflicts = 0
    a, b = rng.sample(range(accounts), 2)
    while True:
        txn = await db.begin(level)
        try:
            va, vb = await txn.get(account(a)), await txn.get(account(b))
            assert va is not None and vb is not None
            await txn.put(account(a), BALANCE.pack(BALANCE.unpack(va)[0] - 1))
            await txn.put(account(b), BALANCE.pack(BALANCE.unpack(vb)[0] + 1))
            handle = await txn.commit()
        except Error.Transaction:
            conflicts += 1
            continue
        if durable and handle is not None:
            await handle.await_durable()
        return conflicts


async def run(accounts: int, txns: int, durable_txns: int, workers: int, isolation: str) -> dict:
    from slatedb.uniffi import DbBuilder, IsolationLevel, ObjectStore, WriteBatch

    level = {
        "snapshot": IsolationLevel.SNAPSHOT,
        "serializable": IsolationLevel.SERIALIZABLE_SNAPSHOT,
    }[isolation]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # SlateDB takes the store root from the URL and the path within it separately.
        db = await DbBuilder(f"{tmp.strip('/')}/db", ObjectStore.resolve("file:///")).build()
        try:
            batch = WriteBatch()
            for i in range(accounts):
                batch.put(account(i), BALANCE.pack(START))
            await (await db.write(batch)).await_durable()

            async def measure(name: str, count: int, go: Any) -> None:
                start = time.perf_counter()
                conflicts = await go()
                elapsed = time.perf_counter() - start
                results[name] = {
                    "txns": count,
                    "seconds": elapsed,
                    "txns_per_s": count / elapsed,
                    "conflicts": conflicts,
                }
                print(
                    f"{name}: {count / elapsed:,.0f} txn/s "
                    f"({count} in {elapsed:.2f} s, {conflicts} conflicts)",
                    flush=True,
                )

            async def sequential(count: int, durable: bool) -> int:
                rng = random.Random(1)
                return sum(
                    [await transfer(db, level, rng, accounts, durable) for _ in range(count)]
                )

            async def concurrent() -> int:
                async def worker(seed: int) -> int:
                    rng = random.Random(seed)
                    return sum(
                        [
                            await transfer(db, level, rng, accounts, False)
                            for _ in range(txns // workers)
                        ]
                    )

                return sum(await asyncio.gather(*(worker(w) for w in range(workers))))

            await measure("1 task, commit not awaited", txns, lambda: sequential(txns, False))
            await measure(
                "1 task, commit awaited durable",
                durable_txns,
                lambda: sequential(durable_txns, True),
            )
            await measure(
                f"{workers} tasks, commit not awaited", txns // workers * workers, concurrent
            )
            total = 0
            for i in range(accounts):
                value = await db.get(account(i))
                assert value is not None
                total += BALANCE.unpack(value)[0]
            assert total == START * accounts, total
        finally:
            await db.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--txns", type=int, default=2000)
    parser.add_argument("--durable-txns", type=int, default=30)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--isolation", choices=["snapshot", "serializable"], default="snapshot")
    parser.add_argument("--name", default="txn-slatedb")
    args = parser.parse_args()
    results = asyncio.run(
        run(args.accounts, args.txns, args.durable_txns, args.workers, args.isolation)
    )
    RESULTS.mkdir(exist_ok=True)
    command = (
        f"python -m bench.txn_slatedb --accounts {args.accounts} --txns {args.txns} "
        f"--durable-txns {args.durable_txns} --workers {args.workers} --isolation {args.isolation}"
    )
    (RESULTS / f"{args.name}.json").write_text(
        json.dumps({"command": command, "results": results}, indent=1)
    )
    print(f"wrote bench/results/{args.name}.json")


if __name__ == "__main__":
    main()
