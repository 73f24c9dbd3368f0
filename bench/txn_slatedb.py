"""SlateDB's side of ``bench.txn``: the same transfer workload on SlateDB's Python package
(``slatedb`` 0.17, a Rust core behind asyncio bindings).

    python -m bench.txn_slatedb --stores file --clients 1 4

is ``python -m bench.txn --engines slatedb`` with the same options (SlateDB alone).
``clients`` asyncio tasks in one event loop each run transfers for the run's length: begin,
two ``get``s, two ``put``s, ``commit()`` (and, when durable, ``await_durable()`` on the write
handle it returns); a conflict raises ``Error.Transaction`` at commit and the transfer is
retried.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from bench.txn import BALANCE, START, Workload, account, moved, pair, result


def slatedb_run(url: str, w: Workload) -> dict[str, Any]:
    """``w.clients`` tasks doing transfers for ``w.seconds`` on a fresh SlateDB database at
    ``url`` (``memory://`` or ``file:///...``)."""
    from slatedb.uniffi import DbBuilder, Error, IsolationLevel, ObjectStore, WriteBatch

    level = {
        "snapshot": IsolationLevel.SNAPSHOT,
        "serializable": IsolationLevel.SERIALIZABLE_SNAPSHOT,
    }[w.isolation]
    durable, accounts = w.mode == "durable", w.accounts
    # As bench.engines: SlateDB resolves the store root from the URL, the path separately.
    parts = urlsplit(url)
    path = parts.path.strip("/") or "db"
    store = ObjectStore.resolve(f"{parts.scheme}://{parts.netloc}/")

    async def run() -> dict[str, Any]:
        db: Any = await DbBuilder(path, store).build()
        try:
            batch = WriteBatch()
            for i in range(accounts):
                batch.put(account(i), BALANCE.pack(START))
            await (await db.write(batch)).await_durable()
            done = conflicts = 0
            deadline = time.monotonic() + w.seconds

            async def work(c: int) -> None:
                nonlocal done, conflicts
                rng = random.Random(c)
                while time.monotonic() < deadline:
                    src, dst = pair(rng, accounts)
                    while True:
                        txn = await db.begin(level)
                        try:
                            new_src, new_dst = moved(await txn.get(src), await txn.get(dst))
                            await txn.put(src, new_src)
                            await txn.put(dst, new_dst)
                            handle = await txn.commit()
                        except Error.Transaction:
                            conflicts += 1
                            continue
                        if durable and handle is not None:
                            await handle.await_durable()
                        break
                    done += 1

            started = time.perf_counter()
            await asyncio.gather(*(work(c) for c in range(w.clients)))
            await db.flush()
            elapsed = time.perf_counter() - started
            total = 0
            for i in range(accounts):
                value = await db.get(account(i))
                assert value is not None
                total += BALANCE.unpack(value)[0]
            assert total == START * accounts, total
        finally:
            await db.shutdown()
        return result(done, elapsed, conflicts)

    return asyncio.run(run())


def main() -> None:
    from bench.txn import main as txn_main

    txn_main(["--engines", "slatedb", "--name", "txn-slatedb", *sys.argv[1:]])


if __name__ == "__main__":
    main()
