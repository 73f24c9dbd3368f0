"""Transactions per second: slatepy's optimistic transactions against SlateDB's (RFC 0020).

    python -m bench.txn --seconds 5 --stores memory file

Each transaction is a transfer between two of 100 accounts: two reads, two writes, a durable
commit (slatepy: ``with db.begin(...)``; SlateDB 0.17: ``db.begin(IsolationLevel)``, then
``commit()`` and its write handle's ``await_durable()``). A conflict is retried until the
transfer commits. ``clients`` transactions run at once: threads for slatepy, asyncio tasks
in one event loop for SlateDB (each engine driven the way its users drive it, as in
``bench.engines``). Prints committed transactions/s, conflicts, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from slatepy import Db, Settings, TransactionConflict

ACCOUNTS = [b"acct%04d" % i for i in range(100)]


@contextmanager
def url_of(store: str) -> Iterator[str]:
    if store == "memory":
        yield "memory://"
    else:
        with tempfile.TemporaryDirectory() as tmp:
            yield f"file://{tmp}/db"


def slatepy_rate(url: str, isolation: str, clients: int, seconds: float) -> tuple[float, int]:
    with Db.open(url, settings=Settings(compactor="in-process")) as db:
        with db.write_batch() as batch:
            for a in ACCOUNTS:
                batch.put(a, b"1000")
        done = [0] * clients
        conflicts = [0] * clients
        deadline = time.monotonic() + seconds

        def work(c: int) -> None:
            rng = random.Random(c)
            while time.monotonic() < deadline:
                src, dst = rng.sample(ACCOUNTS, 2)
                while True:
                    try:
                        with db.begin(isolation) as txn:  # type: ignore[arg-type]
                            a, b = int(txn.get(src) or 0), int(txn.get(dst) or 0)
                            txn.put(src, b"%d" % (a - 1))
                            txn.put(dst, b"%d" % (b + 1))
                        break
                    except TransactionConflict:
                        conflicts[c] += 1
                done[c] += 1

        started = time.monotonic()
        threads = [threading.Thread(target=work, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        assert sum(int(v) for _, v in db.scan()) == 1000 * len(ACCOUNTS)
    return sum(done) / elapsed, sum(conflicts)


def slatedb_rate(url: str, isolation: str, clients: int, seconds: float) -> tuple[float, int]:
    from slatedb.uniffi import DbBuilder, IsolationLevel, ObjectStore
    from slatedb.uniffi import WriteBatch as SdbBatch

    level = (
        IsolationLevel.SNAPSHOT
        if isolation == "snapshot"
        else (IsolationLevel.SERIALIZABLE_SNAPSHOT)
    )
    if url.startswith("memory"):
        store, path = ObjectStore.resolve("memory:///"), "db"
    else:
        # As bench.engines: the store root from the URL, the path given separately.
        store, path = ObjectStore.resolve("file:///"), url.removeprefix("file://").strip("/")

    async def run() -> tuple[float, int]:
        db: Any = await DbBuilder(path, store).build()
        batch = SdbBatch()
        for a in ACCOUNTS:
            batch.put(a, b"1000")
        await (await db.write(batch)).await_durable()
        done = conflicts = 0
        deadline = time.monotonic() + seconds

        async def work(c: int) -> None:
            nonlocal done, conflicts
            rng = random.Random(c)
            while time.monotonic() < deadline:
                src, dst = rng.sample(ACCOUNTS, 2)
                while True:
                    txn = await db.begin(level)
                    try:
                        a = int(await txn.get(src) or 0)
                        b = int(await txn.get(dst) or 0)
                        await txn.put(src, b"%d" % (a - 1))
                        await txn.put(dst, b"%d" % (b + 1))
                        handle = await txn.commit()
                        if handle is not None:
                            await handle.await_durable()
                        break
                    except Exception:
                        conflicts += 1
                done += 1

        started = time.monotonic()
        await asyncio.gather(*(work(c) for c in range(clients)))
        elapsed = time.monotonic() - started
        await db.shutdown()
        return done / elapsed, conflicts

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--stores", nargs="+", default=["memory", "file"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--isolation", default="serializable")
    parser.add_argument("--no-slatedb", action="store_true")
    args = parser.parse_args()
    print(f"durable transfer transactions/s ({args.isolation}; {args.seconds:g} s each)")
    print(
        f"{'store':8} {'clients':>7} {'slatepy':>10} {'conflicts':>9} {'slatedb':>10} "
        f"{'conflicts':>9} {'ratio':>7}"
    )
    for store in args.stores:
        for clients in args.clients:
            with url_of(store) as url:
                ours, our_conflicts = slatepy_rate(url, args.isolation, clients, args.seconds)
            theirs, their_conflicts = (0.0, 0)
            if not args.no_slatedb:
                with url_of(store) as url:
                    theirs, their_conflicts = slatedb_rate(
                        url, args.isolation, clients, args.seconds
                    )
            ratio = f"{ours / theirs:.1f}x" if theirs else "-"
            print(
                f"{store:8} {clients:>7} {ours:10.0f} {our_conflicts:>9} {theirs:10.1f} "
                f"{their_conflicts:>9} {ratio:>7}"
            )


if __name__ == "__main__":
    main()
