"""One racing writer of ``test_linearizability``: ``python -m tests.persist.linearizability_child
URL PID OPS SEED RATE OUT``.

Appends OPS operations to shard ``race``, each at the upper it just fetched, through a blob
store and a consensus that both fail on purpose (refused, lost on the way, acted with the
reply lost) at RATE; every fifth operation is a batch large enough to be a blob part. Writes
to OUT, as JSON, which operations were acknowledged (with the upper they were appended at),
which ended uncertain, and the faults injected.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TypeVar

from slatepy.config import Settings
from slatepy.errors import StoreUnavailable
from slatepy.persist import PersistClient, UpperMismatch
from slatepy.persist.config import PersistSettings
from slatepy.persist.errors import StateConflictError
from slatepy.persist.location.open import open_consensus
from slatepy.store import open_store
from slatepy.store.stack import open_stack
from slatepy.testing.faults import FaultyStore, uniform
from slatepy.testing.persist_faults import FaultyConsensus, consensus_uniform

TRIES = 200
T = TypeVar("T")


def updates(pid: int, n: int, t: int) -> list[tuple[tuple[bytes, bytes], int, int]]:
    """Operation ``n`` of writer ``pid`` at time ``t``: one update, or 60 (a blob part)."""
    if n % 5 == 4:
        return [((b"p%d-%d-%02d" % (pid, n, i), b"x" * 100), t, 1) for i in range(60)]
    return [((b"p%d-%d" % (pid, n), b""), t, 1)]


def main(url: str, pid: int, ops: int, seed: int, rate: float, out: str) -> None:  # noqa: PLR0917
    # Faults below the retrying stack (as a flaky network would cause them), and on the
    # consensus calls themselves.
    faulty = FaultyStore(open_store(url), rates=uniform(rate), seed=seed)
    stack = open_stack(faulty, Settings())
    consensus = FaultyConsensus(open_consensus(stack), rates=consensus_uniform(rate), seed=seed + 1)
    acked: list[list[int]] = []
    uncertain: list[int] = []
    settings = PersistSettings(allow_short_leases=True)
    with PersistClient.open(stack, consensus=consensus, settings=settings) as client:
        write = _retried(lambda: client.open_writer("race"))
        for n in range(ops):
            for _ in range(TRIES):
                upper = _retried(write.fetch_recent_upper)
                assert upper is not None
                try:
                    write.compare_and_append(updates(pid, n, upper), upper, upper + 1)
                except (UpperMismatch, StateConflictError):
                    continue  # another writer took this upper (or kept winning): nothing landed
                except StoreUnavailable as exc:
                    if exc.definite:
                        continue
                    uncertain.append(n)  # it may have landed: never written again
                    break
                acked.append([n, upper])
                break
            else:
                raise SystemExit(f"writer {pid}: operation {n} found no free upper in {TRIES}")
        consensus.close()
    faults = dict(faulty.counts) | {f"consensus {k}": v for k, v in consensus.counts.items()}
    with open(out, "w") as f:
        json.dump({"acked": acked, "uncertain": uncertain, "faults": faults}, f)


def _retried(call: Callable[[], T]) -> T:
    """``call()``, tried again while the store is unavailable (reads change nothing)."""
    for _ in range(TRIES - 1):
        try:
            return call()
        except StoreUnavailable:
            continue
    return call()


if __name__ == "__main__":
    url, pid, ops, seed, rate, out = sys.argv[1:]
    main(url, int(pid), int(ops), int(seed), float(rate), out)
