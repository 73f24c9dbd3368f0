"""One racing writer of ``test_linearizability``: ``python -m tests.persist.linearizability_child
CONFIG`` (JSON: ``url``, ``store_settings``, ``consensus`` (None or a PostgreSQL URL),
``table``, ``pid``, ``ops``, ``seed``, ``rate``, ``out``).

Appends ``ops`` operations to shard ``race``, each at the upper it just fetched, through a
blob store and a consensus that both fail on purpose (refused, lost on the way, acted with
the reply lost) at ``rate``; every fifth operation is a batch large enough to be a blob part.
Its client compacts and collects garbage in the background with ``batch_lease`` 2 s, so
parts, rollups and consensus entries are deleted while the others race (RFC 0015 §13.4).
Writes to ``out``, as JSON, which operations were acknowledged (with the upper they were
appended at), which ended uncertain, the faults injected and what its GC deleted (every
deletion, also of passes an injected fault stopped later), its lost races and its seconds.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypeVar

from slatepy.config import Settings
from slatepy.errors import SlatepyError, StoreUnavailable
from slatepy.persist import PersistClient, UpperMismatch, maintenance
from slatepy.persist import gc as gc_module
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import StateConflictError, UsageError
from slatepy.persist.gc import GcReport, collect
from slatepy.persist.location.open import open_consensus
from slatepy.persist.machine import ShardMachine
from slatepy.store import open_store
from slatepy.store.stack import open_stack
from slatepy.testing.faults import FaultyStore, uniform
from slatepy.testing.persist_faults import FaultyConsensus, consensus_uniform

TRIES = 400
T = TypeVar("T")

MIN_SECONDS = 12.0
"""The least a child's operations take: six ``batch_lease`` spans, so parts age past it
while the others still write and GC deletes some during the run. (Eight seconds left a
loaded CI run's file variant with one completed GC pass and no part deleted: a pass that
meets an injected fault holds the claim 2.5 s, so 8 s allowed about three tries.)"""

SETTINGS = PersistSettings(
    allow_short_leases=True,
    batch_lease=2.0,
    consensus_min_age=5.0,
    write_stall_timeout=0.5,  # the most batch_lease / 4 allows
    gc_min_versions=8,
    merge_lease=0.5,  # a GC claim lasts 5 x merge_lease: a pass that failed blocks 2.5 s
)
"""Short enough that GC deletes parts, rollups and consensus entries during the run. (The
truncation guard, ``consensus_min_age``, stays above how long a create may be in flight
under the injected faults and the store's retries.)"""


def updates(pid: int, n: int, t: int) -> list[tuple[tuple[bytes, bytes], int, int]]:
    """Operation ``n`` of writer ``pid`` at time ``t``: one update, or 60 (a blob part)."""
    if n % 5 == 4:
        return [((b"p%d-%d-%02d" % (pid, n, i), b"x" * 100), t, 1) for i in range(60)]
    return [((b"p%d-%d" % (pid, n), b""), t, 1)]


def main(config: dict[str, object]) -> None:
    pid, ops, seed, rate = (int(str(config[k])) for k in ("pid", "ops", "seed", "rate_pct"))
    store_settings = Settings.from_dict(dict(config["store_settings"]))  # type: ignore[call-overload]
    gc = Counter[str]()

    def counted_collect(machine: ShardMachine, *, claimant: str) -> GcReport:
        report = collect(machine, claimant=claimant)
        if report.status == "done":
            gc["passes"] += 1
            gc["truncations"] += report.truncated_to is not None
        return report

    def counted_delete(machine: ShardMachine, keys: Iterable[str]) -> None:
        # Each deletion a pass made, also by passes that failed later (most meet a fault).
        for key in keys:
            delete(machine, [key])
            gc["parts" if key.startswith("part/") else "rollups"] += 1

    maintenance.collect = counted_collect  # type: ignore[assignment]  # counts, runs it as is
    delete = gc_module._delete
    gc_module._delete = counted_delete
    # Faults below the retrying stack (as a flaky network would cause them), and on the
    # consensus calls themselves.
    faulty = FaultyStore(
        open_store(str(config["url"]), store_settings), rates=uniform(rate / 100), seed=seed
    )
    stack = open_stack(faulty, store_settings)
    pg = config.get("consensus")
    inner = open_consensus(stack, str(pg) if pg else None, table=str(config["table"]))
    consensus = FaultyConsensus(inner, rates=consensus_uniform(rate / 100), seed=seed + 1)
    acked: list[list[int]] = []
    uncertain: list[int] = []
    with PersistClient.open(stack, consensus=consensus, settings=SETTINGS) as client:
        # A failed pass (most meet an injected fault) is retried after 1 s, not 30 s.
        client._maintenance.retry_after = 1.0
        write = _retried(lambda: client.open_writer("race"))
        # GC passes of this process's own every half second besides those maintenance
        # starts after appends: those depend on who wins the races (one CI run completed 4
        # passes in all, none while a merged part was old enough, and deleted no part).
        running = threading.Event()
        running.set()
        collector = threading.Thread(
            target=_collect_while, args=(running, client.machine("race"), counted_collect, pid)
        )
        collector.start()
        started = time.monotonic()
        lost = 0
        for n in range(ops):
            # Paced to last at least MIN_SECONDS: a fast machine finished all operations
            # (3.9 s) before any part was older than batch_lease, so GC deleted none.
            time.sleep(max(0.0, started + MIN_SECONDS * n / ops - time.monotonic()))
            for _ in range(TRIES):
                upper = _retried(write.fetch_recent_upper)
                assert upper is not None
                try:
                    write.compare_and_append(updates(pid, n, upper), upper, upper + 1)
                except (UpperMismatch, StateConflictError):
                    lost += 1
                    continue  # another writer took this upper (or kept winning): nothing landed
                except UsageError as exc:
                    if "too old" not in str(exc):
                        raise
                    continue  # its parts aged past batch_lease / 2 before the CAS: not landed
                except StoreUnavailable as exc:
                    if exc.definite:
                        continue
                    uncertain.append(n)  # it may have landed: never written again
                    break
                acked.append([n, upper])
                break
            else:
                raise SystemExit(f"writer {pid}: operation {n} found no free upper in {TRIES}")
        appended = time.monotonic()
        running.clear()
        collector.join()
        client.wait_maintenance(10.0)
        drained = time.monotonic()
        consensus.close()
    faults = dict(faulty.counts) | {f"consensus {k}": v for k, v in consensus.counts.items()}
    with open(str(config["out"]), "w") as f:
        json.dump(
            {
                "acked": acked,
                "uncertain": uncertain,
                "faults": faults,
                "gc": gc,
                "lost": lost,
                "seconds": [appended - started, drained - appended],
            },
            f,
        )


def _collect_while(
    running: threading.Event,
    machine: ShardMachine,
    collect_pass: Callable[..., GcReport],
    pid: int,
) -> None:
    """A GC pass every 0.5 s while ``running`` is set; a pass failing on an injected fault
    is simply the next one's to redo."""
    while running.is_set():
        with contextlib.suppress(SlatepyError):
            collect_pass(machine, claimant=f"race-gc-{pid}")
        time.sleep(0.5)


def _retried(call: Callable[[], T]) -> T:
    """``call()``, tried again while the store is unavailable (reads change nothing)."""
    for _ in range(TRIES - 1):
        try:
            return call()
        except StoreUnavailable:
            continue
    return call()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
