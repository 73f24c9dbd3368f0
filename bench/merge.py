"""The merge iterators alone: CPU seconds to merge sorted entry streams, no I/O.

    python -m bench.merge [--sources 4] [--entries 250000] [--repeat 5]

Each source holds ``--entries`` sorted keys drawn from a key space twice the total (so
about a third of the keys meet a copy in another source), with newer sources holding
higher seqs; the sources are built in memory before timing. Reports the best of
``--repeat`` runs of ``time.process_time`` per merge, and ns per input entry, for the KV
engine's merge (:func:`merge_newest`), the generic loop with the same combine, and persist's
merge (:func:`merge_sum`, on the same keys with 8-byte diffs as values).
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque
from collections.abc import Callable, Iterator

from slatepy.format.block import Entry
from slatepy.table.merge import merge, merge_newest, merge_sum, newest

Merge = Callable[[list[Iterator[Entry]]], Iterator[Entry]]
DIFFS = ((1).to_bytes(8, "little", signed=True), (-1).to_bytes(8, "little", signed=True))


def sources(count: int, entries: int, *, diffs: bool = False, seed: int = 13) -> list[list[Entry]]:
    """``count`` sorted sources of ``entries`` each, newest (highest seqs) first; values of
    96 bytes, or diffs (+1 or -1 as i64) when ``diffs``."""
    rng = random.Random(seed)
    space = 2 * count * entries
    built: list[list[Entry]] = []
    for s in range(count):
        seq = (count - s) * entries
        keys = sorted(rng.sample(range(space), entries))
        built.append(
            [
                (b"key%013d" % k, seq + i, DIFFS[k % 2] if diffs else (b"%016d" % k) * 6)
                for i, k in enumerate(keys)
            ]
        )
    return built


def best_seconds(function: Merge, inputs: list[list[Entry]], repeat: int) -> float:
    """The least CPU time of ``repeat`` full merges of ``inputs``."""
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        deque(function([iter(s) for s in inputs]), maxlen=0)
        best = min(best, time.process_time() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=4)
    parser.add_argument("--entries", type=int, default=250_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    values = sources(args.sources, args.entries)
    diffs = sources(args.sources, args.entries, diffs=True)
    total = args.sources * args.entries
    cases: list[tuple[str, Merge, list[list[Entry]]]] = [
        ("merge_newest", merge_newest, values),
        ("merge(newest)", lambda s: merge(s, newest), values),
        ("merge_sum", merge_sum, diffs),
    ]
    for name, function, inputs in cases:
        seconds = best_seconds(function, inputs, args.repeat)
        print(
            f"{name:<16} {args.sources} x {args.entries:,}: {seconds:.3f} s "
            f"({seconds / total * 1e9:.0f} ns/entry, best of {args.repeat})"
        )


if __name__ == "__main__":
    main()
