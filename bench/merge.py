"""The merge iterators alone: CPU seconds to merge sorted entry streams, no I/O.

    python -m bench.merge [--sources 4] [--entries 250000] [--repeat 5]

Each source holds ``--entries`` sorted keys drawn from a key space twice the total (so
about a third of the keys meet a copy in another source), with newer sources holding
higher seqs; the sources are built in memory before timing. Reports the best of
``--repeat`` runs of ``time.process_time`` per merge, and ns per input entry.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque
from collections.abc import Callable, Iterator

from slatepy.format.block import Entry
from slatepy.table.merge import merge_newest

Merge = Callable[[list[Iterator[Entry]]], Iterator[Entry]]


def sources(count: int, entries: int, *, seed: int = 13) -> list[list[Entry]]:
    """``count`` sorted sources of ``entries`` each, newest (highest seqs) first."""
    rng = random.Random(seed)
    space = 2 * count * entries
    built: list[list[Entry]] = []
    for s in range(count):
        seq = (count - s) * entries
        keys = sorted(rng.sample(range(space), entries))
        built.append([(b"key%013d" % k, seq + i, (b"%016d" % k) * 6) for i, k in enumerate(keys)])
    return built


def best_seconds(merge: Merge, inputs: list[list[Entry]], repeat: int) -> float:
    """The least CPU time of ``repeat`` full merges of ``inputs``."""
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        deque(merge([iter(s) for s in inputs]), maxlen=0)
        best = min(best, time.process_time() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=4)
    parser.add_argument("--entries", type=int, default=250_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    inputs = sources(args.sources, args.entries)
    total = args.sources * args.entries
    cases: dict[str, Merge] = {"merge_newest": merge_newest}
    for name, merge in cases.items():
        seconds = best_seconds(merge, inputs, args.repeat)
        print(
            f"{name:<16} {args.sources} x {args.entries:,}: {seconds:.3f} s "
            f"({seconds / total * 1e9:.0f} ns/entry, best of {args.repeat})"
        )


if __name__ == "__main__":
    main()
