"""Transactions per second: slatepy's optimistic transactions against SlateDB's (RFC 0020).

    python -m bench.txn --stores file --clients 1 4 --seconds 3 --repeat 3

One workload for both engines: transfers between ``--accounts`` accounts (8-byte
little-endian balances, all starting at 1,000). A transaction reads two random accounts,
moves 1 from the first to the second, writes both and commits; a conflict is retried until
the transfer commits (the retries are counted). ``clients`` transfers run at once: threads
for slatepy, asyncio tasks in one event loop for SlateDB (each engine driven the way its
users drive it, as in ``bench.engines``). The sum of the balances is checked after each run.

Two commit modes:

* ``durable``: each commit returns once its writes are in the WAL (slatepy: ``commit()``;
  SlateDB 0.17: ``commit()`` then ``await_durable()`` on its write handle);
* ``unawaited``: each commit returns once its writes are applied and visible (slatepy:
  ``commit(await_durable=False)``; SlateDB: ``commit()`` alone); the run ends with a flush of
  the WAL, inside the timed part, so the writes are durable when the clock stops.

Both engines run with their default settings (a WAL flush every 100 ms for unawaited
writes; slatepy also flushes at once for an awaited commit, SlateDB waits for its tick).
The engines take turns, ``--repeat`` times, and each cell is the median of its runs. Also
reported: slatepy's object-store requests per 1,000 transactions, its in-process compactor's
included (SlateDB's store is inside its Rust core: not counted). Writes
``bench/results/<name>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slatepy import Db, TransactionConflict, WriteBatch

RESULTS = Path(__file__).parent / "results"
BALANCE = struct.Struct("<q")
START = 1_000
MODES = ("durable", "unawaited")
ENGINES = ("slatepy", "slatedb")


def account(i: int) -> bytes:
    return b"acct%012d" % i


def pair(rng: random.Random, accounts: int) -> tuple[bytes, bytes]:
    """The two accounts of the next transfer: money moves from the first to the second
    (two different ones, uniformly; cheaper than ``rng.sample``, which would cost as much
    as a slatepy transaction's own work)."""
    a, b = rng.randrange(accounts), rng.randrange(accounts - 1)
    return account(a), account(b + (b >= a))


def moved(source: bytes | None, target: bytes | None) -> tuple[bytes, bytes]:
    """The two balances after a transfer of 1 from ``source`` to ``target``."""
    assert source is not None and target is not None
    return (
        BALANCE.pack(BALANCE.unpack(source)[0] - 1),
        BALANCE.pack(BALANCE.unpack(target)[0] + 1),
    )


def result(txns: int, elapsed: float, conflicts: int, **extra: Any) -> dict[str, Any]:
    return {
        "txns": txns,
        "seconds": elapsed,
        "txns_per_s": txns / elapsed,
        "conflicts": conflicts,
        **extra,
    }


@contextmanager
def url_of(store: str) -> Iterator[str]:
    if store == "memory":
        yield "memory://"
    elif store == "file":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"file://{tmp}/db"
    else:
        raise SystemExit(f"unknown store {store!r} (memory, file)")


@dataclass(frozen=True)
class Workload:
    """One run's parameters (see the module docstring)."""

    mode: str
    isolation: str
    clients: int
    seconds: float
    accounts: int


def slatepy_run(url: str, w: Workload) -> dict[str, Any]:
    """``w.clients`` threads doing transfers for ``w.seconds`` on a fresh slatepy database."""
    durable, isolation, accounts = w.mode == "durable", w.isolation, w.accounts
    with Db.open(url) as db:
        batch = WriteBatch()
        for i in range(accounts):
            batch.put(account(i), BALANCE.pack(START))
        db.write(batch)
        done = [0] * w.clients
        conflicts = [0] * w.clients
        before = db.metrics.snapshot()
        deadline = time.monotonic() + w.seconds

        def work(c: int) -> None:
            rng = random.Random(c)
            while time.monotonic() < deadline:
                src, dst = pair(rng, accounts)
                while True:
                    txn = db.begin(isolation)  # type: ignore[arg-type]
                    try:
                        new_src, new_dst = moved(txn.get(src), txn.get(dst))
                        txn.put(src, new_src)
                        txn.put(dst, new_dst)
                        txn.commit(await_durable=durable)
                        break
                    except TransactionConflict:
                        txn.rollback()
                        conflicts[c] += 1
                done[c] += 1

        started = time.perf_counter()
        threads = [threading.Thread(target=work, args=(c,)) for c in range(w.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        db.flush()
        elapsed = time.perf_counter() - started
        after = db.metrics.snapshot()
        requests = {
            kind: stats.requests - (before[kind].requests if kind in before else 0)
            for kind, stats in after.items()
        }
        total = sum(BALANCE.unpack(value)[0] for _, value in db.scan(b"acct"))
        assert total == START * accounts, total
    txns = sum(done)
    return result(
        txns,
        elapsed,
        sum(conflicts),
        requests_per_1000={k: 1000 * n / txns for k, n in sorted(requests.items()) if n},
    )


def run_once(engine: str, store: str, w: Workload) -> dict[str, Any]:
    with url_of(store) as url:
        if engine == "slatepy":
            return slatepy_run(url, w)
        from bench.txn_slatedb import slatedb_run

        return slatedb_run(url, w)


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median rate, conflicts and request counts of repeated runs of one cell."""
    out: dict[str, Any] = {
        "txns_per_s": statistics.median(r["txns_per_s"] for r in runs),
        "conflicts": statistics.median(r["conflicts"] for r in runs),
        "runs": len(runs),
    }
    if "requests_per_1000" in runs[0]:
        kinds = sorted({k for r in runs for k in r["requests_per_1000"]})
        out["requests_per_1000"] = {
            k: statistics.median(r["requests_per_1000"].get(k, 0.0) for r in runs) for k in kinds
        }
    return out


def cell_key(store: str, clients: int, mode: str) -> str:
    return f"{store}/{clients}/{mode}"


def table(run: dict[str, Any]) -> str:
    medians = run["medians"]
    lines = [
        f"# bench.txn: transfers (read 2 keys, write 2 keys), {run['isolation']} isolation, "
        f"{run['accounts']} accounts",
        "",
        f"`{run['command']}`",
        "",
        f"Each cell: the median of {run['repeat']} runs of {run['seconds']:g} s (engines "
        "interleaved). Requests: slatepy's object-store requests per 1,000 transactions, "
        "its in-process compactor's included (the GETs: it reads the WAL SSTs; with the "
        "compactor off a durable transaction is exactly one PUT).",
        "",
        "| store | clients | commit | slatepy txn/s | slatedb txn/s | slatepy / slatedb "
        "| conflicts (slatepy, slatedb) | slatepy requests / 1,000 txns |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for store in run["stores"]:
        for clients in run["clients"]:
            for mode in run["modes"]:
                cell = medians[cell_key(store, clients, mode)]
                ours, theirs = cell.get("slatepy"), cell.get("slatedb")
                ratio = (
                    f"{ours['txns_per_s'] / theirs['txns_per_s']:,.1f}x" if ours and theirs else "-"
                )
                requests = (
                    ", ".join(
                        f"{_count(n)} {kind.upper()}"
                        for kind, n in ours["requests_per_1000"].items()
                    )
                    if ours
                    else "-"
                )
                lines.append(
                    f"| {store} | {clients} | {mode} "
                    f"| {_rate(ours)} | {_rate(theirs)} | {ratio} "
                    f"| {_conflicts(ours)}, {_conflicts(theirs)} | {requests or '0'} |"
                )
    return "\n".join(lines) + "\n"


def _count(n: float) -> str:
    return f"{n:,.0f}" if n >= 10 else f"{n:.2g}"


def _rate(cell: dict[str, Any] | None) -> str:
    return "-" if cell is None else f"{cell['txns_per_s']:,.1f}"


def _conflicts(cell: dict[str, Any] | None) -> str:
    return "-" if cell is None else f"{cell['conflicts']:g}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each run")
    parser.add_argument("--stores", nargs="+", default=["file"], choices=["memory", "file"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--isolation", choices=["snapshot", "serializable"], default="snapshot")
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per cell")
    parser.add_argument("--name", default="txn", help="bench/results/<name>.json and .md")
    args = parser.parse_args(argv)
    command = (
        f"python -m bench.txn --stores {' '.join(args.stores)} "
        f"--clients {' '.join(map(str, args.clients))} --modes {' '.join(args.modes)} "
        f"--engines {' '.join(args.engines)} --isolation {args.isolation} "
        f"--accounts {args.accounts} --seconds {args.seconds:g} --repeat {args.repeat} "
        f"--name {args.name}"
    )
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for repeat in range(args.repeat):
        for store in args.stores:
            for clients in args.clients:
                for mode in args.modes:
                    cell = runs.setdefault(cell_key(store, clients, mode), {})
                    for engine in args.engines:
                        workload = Workload(
                            mode, args.isolation, clients, args.seconds, args.accounts
                        )
                        one = run_once(engine, store, workload)
                        cell.setdefault(engine, []).append(one)
                        print(
                            f"[{repeat + 1}/{args.repeat}] {store} {clients} client(s) {mode} "
                            f"{engine}: {one['txns_per_s']:,.1f} txn/s "
                            f"({one['txns']} txns, {one['conflicts']} conflicts)",
                            flush=True,
                        )
    run = {
        "command": command,
        "stores": args.stores,
        "clients": args.clients,
        "modes": args.modes,
        "isolation": args.isolation,
        "accounts": args.accounts,
        "seconds": args.seconds,
        "repeat": args.repeat,
        "medians": {
            key: {engine: median_of(results) for engine, results in cell.items()}
            for key, cell in runs.items()
        },
        "runs": runs,
    }
    text = table(run)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(run, indent=1))
    (RESULTS / f"{args.name}.md").write_text(text)
    print(f"wrote bench/results/{args.name}.json, .md")


if __name__ == "__main__":
    main()
